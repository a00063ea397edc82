/* commands.h - the subcommands of the megascale binary.  Each takes the
 * arguments after its name and returns a process exit code (0 ok, 1 run-time
 * failure, 2 usage error), printing its own errors. */
#ifndef CLI_COMMANDS_H
#define CLI_COMMANDS_H

#include "base/status.h"

int cmd_train(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_launch(int argc, char **argv);

/* Print "megascale <cmd>: error: <message>" and return the exit code. */
int cli_fail(const char *cmd, ms_status st);

#endif
