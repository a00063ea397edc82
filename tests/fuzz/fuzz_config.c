/* fuzz_config.c - libFuzzer harness of the config-file parser of the option
 * table (src/cli/opts.c: opts_parse with --config FILE, "name = value"
 * lines), on the real table of `megascale train`.
 *
 * cmd_train.c is included so that its static table (train_opts: every
 * type, range and environment variable the trainer declares) is the one
 * parsed; its call into the trainer is never made (fuzz_stubs.c).  The
 * input is the config file.  The parser must reject it with a status or
 * accept it; never crash or leak (on failure too: opts_free frees what was
 * set).  On a file it accepts, the effective options print as a JSON object
 * holding every option.
 */
#include <cjson/cJSON.h>

#include "cli/cmd_train.c"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_init("fuzz_config");
    for (int i = 0; i < N_TRAIN_OPTS; i++) /* only the file sets options */
        if (train_opts[i].env) unsetenv(train_opts[i].env);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    train_cli c = {0};
    char *argv[] = {"--config", (char *)fuzz_file("train.cfg", data, size), "--steps=7"};
    char *pos[1];
    int npos = 0, help = 0;
    ms_status rc = opts_parse(train_opts, N_TRAIN_OPTS, &c, 3, argv, pos, 0, &npos, &help);
    fuzz_said("config", rc);
    if (rc == MS_OK) {
        MS_CHECK(c.tc.steps == 7 && npos == 0 && !help); /* the command line wins */
        MS_CHECK(c.config.n == 1);                       /* the file read, recorded */
        char *text = opts_to_json(train_opts, N_TRAIN_OPTS, &c, NULL);
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        /* every option but the recorded --config files */
        MS_CHECKF(cJSON_IsObject(j) && cJSON_GetArraySize(j) == N_TRAIN_OPTS - 1,
                  "opts_to_json: not an object of every option: %.200s", text ? text : "(null)");
        cJSON_Delete(j);
        free(text);
    } else {
        MS_CHECKF(rc == MS_ERR_ARG || rc == MS_ERR_FORMAT, "unexpected status %s: %s",
                  ms_status_name(rc), ms_errmsg());
    }
    opts_free(train_opts, N_TRAIN_OPTS, &c);
    return 0;
}
