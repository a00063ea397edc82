/* llmc_step.c - bench/cpu_step.py's driver for llm.c's CPU trainer, the
 * peer issue 15 names beside PyTorch.
 *
 * llm.c is not shipped with megascale and nothing fetches it: the bench
 * builds this file only against a checkout the user names (--llmc DIR, or
 * LLMC_DIR), with llm.c's own flags:
 *   cc -Ofast -march=native -fopenmp -DOMP -I DIR bench/llmc_step.c -lm
 * It includes DIR/train_gpt2.c with that file's main() renamed (its main
 * trains a fixed 40 steps with validation and sampling in between, at a
 * fixed B=4, T=64) and runs the same training step as that main does
 * (forward, zero_grad, backward, AdamW) on the model file and token shard
 * given, for B, T and a number of steps, printing one {"ms": ...} line a
 * step as bench/torch_gpt_step.py does.
 *
 * usage: llmc_step MODEL.bin SHARD.bin B T STEPS */
#define main llmc_train_gpt2_main
#include "train_gpt2.c"
#undef main

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: llmc_step MODEL.bin SHARD.bin B T STEPS\n");
        return 2;
    }
    int B = atoi(argv[3]), T = atoi(argv[4]), steps = atoi(argv[5]);
    if (B < 1 || T < 1 || steps < 1) {
        fprintf(stderr, "llmc_step: B, T and STEPS must be positive\n");
        return 2;
    }
    GPT2 model;
    gpt2_build_from_checkpoint(&model, argv[1]);
    if ((size_t)T > (size_t)model.config.max_seq_len) {
        fprintf(stderr, "llmc_step: T=%d exceeds the model's max_seq_len %d\n", T,
                model.config.max_seq_len);
        return 2;
    }
    DataLoader loader;
    dataloader_init(&loader, argv[2], B, T, 0, 1, 0);
    for (int s = 0; s < steps; s++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, s + 1);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        printf("{\"ms\": %.3f, \"loss\": %.6f}\n", ms, model.mean_loss);
        fflush(stdout);
    }
    dataloader_free(&loader);
    gpt2_free(&model);
    return 0;
}
