/* opts.h - the option table: every option is declared once (name, type,
 * default, help) and serves the command line (--name VALUE or
 * --name=VALUE), config files (--config FILE: "name = value" lines, '#'
 * comments) and the generated --help text.  Values are stored into a
 * caller's struct at the declared offsets; strings are malloc'd (freed by
 * opts_free).  An option may name an environment variable (its env
 * column), read here and nowhere else: library code never calls getenv.
 * A numeric option may declare a range (its range column), checked by the
 * parser wherever the value comes from; a DOUBLE must also be finite, an
 * INT fit in 32 bits.
 * Precedence: defaults < config file < environment < command line.
 */
#ifndef CLI_OPTS_H
#define CLI_OPTS_H

#include <stddef.h>

#include "base/status.h"

/* OPT_T_LIST is a repeatable string option stored as an opts_list: each
 * occurrence appends one value (`--input a --input b`, or two "input = ..."
 * lines), and the first occurrence in a source (a config file, the
 * environment, the command line) replaces what an earlier source set, so
 * the command line still overrides a config file. */
typedef enum { OPT_T_INT, OPT_T_U64, OPT_T_DOUBLE, OPT_T_STR, OPT_T_LIST } opts_type;

typedef struct {
    char **v; /* n malloc'd values, in order (freed by opts_free) */
    int n;
    int from; /* the parser's: the source that set the values */
} opts_list;

typedef struct {
    const char *name; /* without "--" */
    opts_type type;
    size_t offset;
    const char *def; /* default as text; NULL for an empty string */
    const char *help;
    const char *env; /* environment variable that sets it (NULL: none) */
    /* INT, U64, DOUBLE: the values allowed, "[lo,hi]" with '(' or ')' for an
     * open end and an empty bound for none: "(0,)" is > 0, "[0,1)" is 0 <= x
     * < 1, "[1,1024]" is 1..1024.  NULL: any value of the type.  A malformed
     * range is a broken invariant (the parser aborts).  STR: the values
     * allowed, separated by '|' ("fp32|bf16"), checked as a range is
     * (wherever the value comes from, the message naming that source: a
     * variable's error names the variable); NULL: any string. */
    const char *range;
    /* 1: the option may differ between the ranks of one job (it acts on
     * this rank alone: its threads, its deadlines, its supervision), so
     * opts_to_json_shared leaves it out; 0: every rank must give the same
     * value (`megascale train` compares them at start-up). */
    int per_rank;
    /* 1 (an INT option only): on the command line the option may be given
     * bare, `--json`, which means 1.  The next argument is its value only
     * when it reads as an integer (`--json 0`; out of its range: an error),
     * so `--json --other` and `--json DIR` are the bare flag followed by an
     * option / a positional; `--json=0` is always the value. */
    int bare;
} opts_spec;

/* A table may record the --config files it read: an OPT_T_LIST entry named
 * "config" (no default) gets each one's path, in order, so a command can
 * refuse an output that is its own config file.  It is not an option
 * itself (a "config = ..." line is refused, --help shows --config FILE). */
#define OPTS_CONFIG_FILES(st, f)                                                                   \
    {                                                                                              \
        .name = "config", .type = OPT_T_LIST, .offset = offsetof(st, f), .def = NULL,              \
        .help = "the --config files read", .env = NULL, .range = NULL, .per_rank = 0, .bare = 0    \
    }

/* A 0/1 flag of struct st's int field f, default 0, that may be given bare
 * (opts_spec.bare): `--name`, `--name 1`, `--name=0`. */
#define OPTS_FLAG(nm, st, f, hlp)                                                                  \
    {                                                                                              \
        .name = nm, .type = OPT_T_INT, .offset = offsetof(st, f), .def = "0", .help = hlp,         \
        .env = NULL, .range = "[0,1]", .per_rank = 0, .bare = 1                                    \
    }

/* Parse argv[0..argc) into dst.  Positional arguments (not starting with
 * "--") are returned in pos (up to max_pos).  "--help" sets *help. */
ms_status opts_parse(const opts_spec *spec, int n, void *dst, int argc, char **argv, char **pos,
                     int max_pos, int *n_pos, int *help);
/* The directory option --name of the table (--data-dir DIR), when its value
 * in dst is not its default (given on the command line, in a config file or
 * by its environment variable; empty: the default): an existing directory,
 * whether or not this run reads from it; else MS_ERR_ARG naming --name (and
 * its variable when that set it) and the path.  what: what the directory
 * holds, in words. */
ms_status opts_check_dir(const opts_spec *spec, int n, const void *dst, const char *name,
                         const char *what);
/* An output of the command (opt: its option, in words; path: what it
 * names) checked against the --config files the parse read, which the
 * table records (OPTS_CONFIG_FILES; a table without that entry is a broken
 * invariant): names NULL, path is a file the command writes or appends to;
 * else path is a directory and names the glob(3) patterns (NULL-terminated)
 * of the files it writes there.  A config file that is such a file (by
 * identity: ms_path_is_input) would be overwritten by the run it
 * configures: MS_ERR_ARG naming opt, path and the config file; else MS_OK.
 * path NULL or "": MS_OK. */
ms_status opts_check_output(const opts_spec *spec, int n, const void *dst, const char *opt,
                            const char *path, const char *const *names);
void opts_print_help(const opts_spec *spec, int n, const char *usage);
void opts_free(const opts_spec *spec, int n, void *dst);
/* The effective value of every option as a JSON object's text ("name":
 * value, strings quoted, unset strings null); the options named in secret
 * (NULL-terminated, may be NULL) say "(secret)" when set, not their value.
 * malloc'd, NULL on OOM. */
char *opts_to_json(const opts_spec *spec, int n, const void *dst, const char *const *secret);
/* The same, of the options without per_rank only: the configuration every
 * rank of a job must share. */
char *opts_to_json_shared(const opts_spec *spec, int n, const void *dst);
/* The effective value of every option as a config file (--config) that
 * gives the same values back: header (may be NULL), then "name = value"
 * lines in the table's order, strings quoted, unset strings left out (a
 * value a config file cannot hold, with a '#' or a control character: a
 * comment line saying so), lists one line a value.  "config" and the
 * names in skip (NULL-terminated, may be NULL) are left out.  malloc'd;
 * NULL on OOM. */
char *opts_to_config(const opts_spec *spec, int n, const void *dst, const char *const *skip,
                     const char *header);

#endif
