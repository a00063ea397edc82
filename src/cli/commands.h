/* commands.h - the subcommands of the megascale binary.  Each takes the
 * arguments after its name and returns a process exit code (0 ok, else
 * cli_exit_code's), printing its own errors. */
#ifndef CLI_COMMANDS_H
#define CLI_COMMANDS_H

#include <stddef.h>

#include "base/status.h"

int cmd_train(int argc, char **argv);
/* The train options' effective values (command line, --config file,
 * environment, --out-dir's defaults) that `megascale launch` needs. */
typedef struct {
    char ckpt_dir[4096], resume[4096]; /* "" when none */
    char metrics[4096];                /* "" when none */
    char trace_dir[4096];              /* as given: "" (beside the metrics), none, off, a DIR */
    char device[16];
    int steps, new_run, peak_cache_given;
    int ckpt_every;        /* --ckpt-every (0: only the final checkpoint) */
    double ckpt_every_min; /* --ckpt-every-min (0: none) */
    char *effective; /* every option's effective value that the ranks share, as a JSON object's
                      * text (malloc'd: the caller frees it; NULL on OOM) */
} cli_train_view;
/* Parse train options as `megascale train` would, before a launch starts
 * anything: 0 and *v filled, or 2 (usage) with the error printed, naming the
 * option; an output of train (train_check_outputs) that is one of the train
 * inputs or of its --config files, or the launch's own output events
 * (events_opt: how the launch named it, in words; NULL: none) that is one,
 * or an output file of train named as one of the driver's files in run_dir
 * (run_files: fnmatch patterns, NULL-terminated; run_dir NULL: none), is
 * such an error. */
int cmd_train_check(int argc, char **argv, const char *events_opt, const char *events,
                    const char *run_dir, const char *const *run_files, cli_train_view *v);
/* 1 if NAME (without "--", len characters) is a train option. */
int cmd_train_has_option(const char *name, size_t len);
/* Load --tokenizer NAME (data_tok_load); a name that is neither a file nor a path is
 * MS_ERR_NOTFOUND naming the built-in names (as "gpt2, bytes"), another error is wrapped
 * with "--tokenizer" (cmd_data.c). */
struct data_tokenizer;
ms_status cli_tokenizer_load(struct data_tokenizer **tok, const char *name, const char *data_dir,
                             const char *names);
int cmd_sample(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_diag(int argc, char **argv);
int cmd_dashboard(int argc, char **argv);
int cmd_plan(int argc, char **argv);

/* `megascale diag`: a check of the node failed (its hardware is suspect;
 * the supervisor evicts it).  Not a status class: the run itself worked. */
#define CLI_EXIT_DIAG_FAIL 9

/* The process exit code of a failure, by its class (docs/operations.md):
 * 2 usage, 3 bad input, 4 storage, 5 communication (a peer lost), 6
 * persistent non-finite, 7 device / library, 8 out of memory, 1 other.
 * Chosen here only, so the supervisor can tell a full disk from a dead
 * peer. */
int cli_exit_code(ms_status st);
/* Print "megascale <cmd>: error[ (rank R on HOST)]: <message>" and return
 * cli_exit_code(st). */
int cli_fail(const char *cmd, ms_status st);

#endif
