/* opts.h - the option table: every option is declared once (name, type,
 * default, help) and serves the command line (--name VALUE or
 * --name=VALUE), config files (--config FILE: "name = value" lines, '#'
 * comments) and the generated --help text.  Values are stored into a
 * caller's struct at the declared offsets; strings are malloc'd (freed by
 * opts_free).  Precedence: defaults < config file < command line.
 */
#ifndef CLI_OPTS_H
#define CLI_OPTS_H

#include <stddef.h>

#include "base/status.h"

typedef enum { OPT_T_INT, OPT_T_U64, OPT_T_DOUBLE, OPT_T_STR } opts_type;

typedef struct {
    const char *name; /* without "--" */
    opts_type type;
    size_t offset;
    const char *def; /* default as text; NULL for an empty string */
    const char *help;
} opts_spec;

/* Parse argv[0..argc) into dst.  Positional arguments (not starting with
 * "--") are returned in pos (up to max_pos).  "--help" sets *help. */
ms_status opts_parse(const opts_spec *spec, int n, void *dst, int argc, char **argv, char **pos,
                     int max_pos, int *n_pos, int *help);
void opts_print_help(const opts_spec *spec, int n, const char *usage);
void opts_free(const opts_spec *spec, int n, void *dst);

#endif
