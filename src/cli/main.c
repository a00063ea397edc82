/* main.c - the megascale binary: dispatch to subcommands. */
#include <stdio.h>
#include <string.h>

#include "base/ctx.h"
#include "cli/commands.h"

static void usage(void) {
    printf("usage: megascale <command> [options]\n\n"
           "commands:\n"
           "  train    train a GPT model (megascale train --help)\n"
           "  sample   generate text from saved weights\n"
           "  data     prepare and inspect token shards\n"
           "  ckpt     list, inspect, verify, export and reshard checkpoints\n"
           "  trace    merge event logs into one timeline, stragglers, hang analysis\n"
           "  launch   run a training job under the supervisor (restarts it on faults)\n\n"
           "Each command takes --help.\n");
}

int cli_fail(const char *cmd, ms_status st) {
    fprintf(stderr, "megascale %s: error: %s\n", cmd, ms_errmsg());
    return st == MS_ERR_ARG ? 2 : 1;
}

int main(int argc, char **argv) {
    ms_ctx_init();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "sample")) return cmd_sample(argc - 2, argv + 2);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 2, argv + 2);
    if (!strcmp(cmd, "ckpt")) return cmd_ckpt(argc - 2, argv + 2);
    if (!strcmp(cmd, "trace")) return cmd_trace(argc - 2, argv + 2);
    if (!strcmp(cmd, "launch")) return cmd_launch(argc - 2, argv + 2);
    fprintf(stderr, "megascale: error: unknown command '%s'\n", cmd);
    usage();
    return 2;
}
