/* opts.c - the declarative option parser. */
#include "cli/opts.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/fileio.h"
#include "base/strnum.h"
#include "ckpt/ckpt.h"

static const opts_spec *find(const opts_spec *spec, int n, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(spec[i].name) == len && !strncmp(spec[i].name, name, len)) return &spec[i];
    return NULL;
}

/* An option's declared range (opts_spec.range), parsed. */
typedef struct {
    double lo, hi;        /* -inf / inf: unbounded */
    int lo_open, hi_open; /* 1: the bound itself is excluded */
} opt_range;

static opt_range range_of(const opts_spec *s) {
    const char *r = s->range;
    char *end;
    opt_range g = {-INFINITY, INFINITY, 1, 1};
    MS_CHECKF(s->type != OPT_T_STR && s->type != OPT_T_LIST,
              "option --%s: a string option has choices, not a range", s->name);
    MS_CHECKF(r[0] == '[' || r[0] == '(', "option --%s: bad range '%s'", s->name, r);
    g.lo_open = r[0] == '(';
    r++;
    if (*r != ',') {
        g.lo = strtod(r, &end);
        MS_CHECKF(end != r && *end == ',', "option --%s: bad range '%s'", s->name, s->range);
        r = end;
    }
    r++;
    if (*r != ']' && *r != ')') {
        g.hi = strtod(r, &end);
        MS_CHECKF(end != r, "option --%s: bad range '%s'", s->name, s->range);
        r = end;
    }
    MS_CHECKF((*r == ']' || *r == ')') && !r[1] && g.lo <= g.hi, "option --%s: bad range '%s'",
              s->name, s->range);
    g.hi_open = *r == ')';
    return g;
}

/* A STR option's choices (its range "a|b|c") in words: "a, b or c". */
static void choices_text(const opts_spec *s, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = 0;
    for (const char *c = s->range; *c && len < size; c++)
        if (*c != '|')
            len += (size_t)snprintf(buf + len, size - len, "%c", *c);
        else
            len +=
                (size_t)snprintf(buf + len, size - len, "%s", strchr(c + 1, '|') ? ", " : " or ");
}

/* Whether v is one of a STR option's choices (its range "a|b|c"). */
static int is_choice(const opts_spec *s, const char *v) {
    size_t n = strlen(v);
    for (const char *c = s->range; c; c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL) {
        const char *e = strchr(c, '|');
        if ((e ? (size_t)(e - c) : strlen(c)) == n && !strncmp(c, v, n)) return 1;
    }
    return 0;
}

/* The range in words: "> 0", ">= 1", "in [0,1)"; a STR option's choices:
 * "fp32 or bf16". */
static void range_text(const opts_spec *s, char *buf, size_t size) {
    if (s->type == OPT_T_STR) {
        choices_text(s, buf, size);
        return;
    }
    opt_range g = range_of(s);
    if (isinf(g.hi))
        snprintf(buf, size, "%s %g", g.lo_open ? ">" : ">=", g.lo);
    else if (isinf(g.lo))
        snprintf(buf, size, "%s %g", g.hi_open ? "<" : "<=", g.hi);
    else
        snprintf(buf, size, "in %s", s->range);
}

static int in_range(const opts_spec *s, double x) {
    opt_range g = range_of(s);
    return (g.lo_open ? x > g.lo : x >= g.lo) && (g.hi_open ? x < g.hi : x <= g.hi);
}

/* x, the value v of option s as a number, against the option's range. */
static ms_status check_range(const opts_spec *s, double x, const char *v, const char *where) {
    if (!s->range || in_range(s, x)) return MS_OK;
    char r[128];
    range_text(s, r, sizeof r);
    return ms_error(MS_ERR_ARG, "%s: --%s must be %s, got '%s'", where, s->name, r, v);
}

static void list_clear(opts_list *l) {
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* Store text value v for option s, validating its type; `where` names the
 * source (command line or file:line) for messages, `from` tells the sources
 * apart (a list's first value from a new source replaces the old ones). */
static ms_status set_value(const opts_spec *s, void *dst, const char *v, const char *where,
                           int from) {
    char *end = NULL;
    void *p = (char *)dst + s->offset;
    errno = 0;
    /* strto* skip leading blanks but stop at trailing ones: " 5" and "5 "
     * alike are not numbers (a file's values are trimmed before this) */
    int blank = isspace((unsigned char)*v);
    switch (s->type) {
    case OPT_T_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || blank || *end || (errno && errno != ERANGE))
            return ms_error(MS_ERR_ARG, "%s: --%s expects an integer, got '%s'", where, s->name, v);
        if (errno == ERANGE || x < INT32_MIN || x > INT32_MAX) { /* a 32-bit int in the code */
            MS_TRY(check_range(s, (double)x, v, where));         /* the option's own range first */
            return ms_error(MS_ERR_ARG, "%s: --%s must be %s %ld, got '%s'", where, s->name,
                            x < 0 ? "at least" : "at most", x < 0 ? (long)INT32_MIN : INT32_MAX, v);
        }
        MS_TRY(check_range(s, (double)x, v, where));
        *(int *)p = (int)x;
        break;
    }
    case OPT_T_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || blank || *end || (errno && errno != ERANGE) ||
            strchr(v, '-')) /* strtoull takes " -1" as 2^64-1 */
            return ms_error(MS_ERR_ARG, "%s: --%s expects a non-negative integer, got '%s'", where,
                            s->name, v);
        if (errno == ERANGE) {
            MS_TRY(check_range(s, (double)x, v, where));
            return ms_error(MS_ERR_ARG, "%s: --%s: '%s' is beyond the largest integer (%llu)",
                            where, s->name, v, (unsigned long long)UINT64_MAX);
        }
        MS_TRY(check_range(s, (double)x, v, where));
        *(uint64_t *)p = x;
        break;
    }
    case OPT_T_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || blank || *end || (errno && errno != ERANGE))
            return ms_error(MS_ERR_ARG, "%s: --%s expects a number, got '%s'", where, s->name, v);
        if (errno == ERANGE && isinf(x)) { /* an underflow reads as 0 or subnormal: a range check */
            /* as the largest finite number: an open range ("(0,)") takes it */
            MS_TRY(check_range(s, x > 0 ? DBL_MAX : -DBL_MAX, v, where));
            return ms_error(MS_ERR_ARG, "%s: --%s: '%s' is beyond the largest number (%g)", where,
                            s->name, v, DBL_MAX);
        }
        if (!isfinite(x))
            return ms_error(MS_ERR_ARG, "%s: --%s expects a finite number, got '%s'", where,
                            s->name, v);
        MS_TRY(check_range(s, x, v, where));
        *(double *)p = x;
        break;
    }
    case OPT_T_STR: {
        char **sp = p;
        if (s->range && !is_choice(s, v)) {
            char c[256];
            choices_text(s, c, sizeof c);
            return ms_error(MS_ERR_ARG, "%s: --%s: \"%s\" is not %s", where, s->name, v, c);
        }
        free(*sp);
        *sp = strdup(v);
        if (!*sp) return ms_error(MS_ERR_NOMEM, "out of memory");
        break;
    }
    case OPT_T_LIST: {
        opts_list *l = p;
        if (l->from != from) list_clear(l);
        l->from = from;
        char **g = realloc(l->v, sizeof *g * (size_t)(l->n + 1));
        if (!g) return ms_error(MS_ERR_NOMEM, "out of memory");
        l->v = g;
        if (!(l->v[l->n] = strdup(v))) return ms_error(MS_ERR_NOMEM, "out of memory");
        l->n++;
        break;
    }
    }
    return MS_OK;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

#define CONFIG_MAX_BYTES (1 << 20) /* a config file is a page of text, not a data file */

/* Apply a "name = value" config file: text of at most CONFIG_MAX_BYTES, no
 * NUL byte (the parser would stop there silently). */
static ms_status load_config(const opts_spec *spec, int n, void *dst, const char *path, int from) {
    char *text = NULL;
    size_t len = 0;
    ms_status st = ms_file_read_max(path, CONFIG_MAX_BYTES, &text, &len);
    if (st != MS_OK) return ms_error_wrap(st, "--config");
    /* a FIFO read before its writer opened it ends at once: its options were lost without a
     * word (a --config <(...) has its writer already) */
    struct stat sb;
    if (len == 0 && stat(path, &sb) == 0 && S_ISFIFO(sb.st_mode)) {
        free(text);
        return ms_error(MS_ERR_FORMAT,
                        "--config %s: a FIFO that gave nothing to read (no writer had it open, "
                        "or its writer wrote nothing): give the file itself, or --config <(...)",
                        path);
    }
    const char *nul = memchr(text, 0, len);
    if (nul) {
        int at = 1;
        size_t off = (size_t)(nul - text);
        for (const char *c = text; c < nul; c++)
            at += *c == '\n';
        free(text);
        return ms_error(MS_ERR_FORMAT, "%s:%d: a NUL byte (byte %zu): a config file is text", path,
                        at, off);
    }
    /* a UTF-8 byte-order mark (Windows editors write one) is no part of the
     * first line's name */
    char *body = len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? text + 3 : text;
    int lineno = 0;
    for (char *line = body, *next; line && st == MS_OK; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        char where[4200];
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        /* A comment starts at a '#', except inside a quoted value ("o#6") */
        char *eq = strchr(line, '='), *hash = strchr(line, '#');
        if (eq && (!hash || hash > eq)) {
            char *v = eq + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            if (*v == '"' || *v == '\'') {
                /* the closing quote: the first one followed by nothing or a
                 * comment, so a value may hold its quote ("say "hi"") and a
                 * comment after it may hold one too */
                char *close = NULL, *after = NULL;
                for (char *q = strchr(v + 1, *v); q && !close; q = strchr(q + 1, *v)) {
                    for (after = q + 1; *after == ' ' || *after == '\t' || *after == '\r';)
                        after++;
                    if (!*after || *after == '#') close = q;
                }
                char *first = strchr(v + 1, *v);
                if (!first) {
                    st = ms_error(MS_ERR_ARG, "%s: the value's closing %c is missing", where, *v);
                    break;
                }
                if (!close) {
                    st = ms_error(MS_ERR_ARG,
                                  "%s: text after the value's closing %c: '%s' (quote the "
                                  "whole value)",
                                  where, *v, trim(first + 1));
                    break;
                }
                hash = *after ? after : NULL;
            }
        }
        if (hash) *hash = 0;
        char *l = trim(line);
        if (!*l) continue;
        eq = strchr(l, '=');
        if (!eq) {
            st = ms_error(MS_ERR_ARG, "%s: expected 'name = value', got '%s'", where, l);
            break;
        }
        *eq = 0;
        char *k = trim(l), *v = trim(eq + 1);
        if (!strncmp(k, "--", 2)) k += 2;
        char name[128]; /* train_data is train-data (TOML and YAML habits) */
        snprintf(name, sizeof name, "%s", k);
        for (char *c = name; *c; c++)
            if (*c == '_') *c = '-';
        size_t vl = strlen(v); /* "a value" and 'a value': the quotes are not part of it */
        if (vl >= 2 && (v[0] == '"' || v[0] == '\'') && v[vl - 1] == v[0]) {
            v[vl - 1] = 0;
            v++;
        }
        const opts_spec *s = find(spec, n, name, strlen(name));
        if (!s || !strcmp(name, "config")) {
            st = ms_error(MS_ERR_ARG, "%s: unknown option '%s'", where, k);
            break;
        }
        st = set_value(s, dst, v, where, from);
    }
    free(text);
    return st;
}

/* 1 if argument a is one of the table's options (--name or --name=...),
 * --config, or --help. */
static int names_option(const opts_spec *spec, int n, const char *a) {
    if (strncmp(a, "--", 2) != 0) return 0;
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    return find(spec, n, name, len) || (len == 6 && !strncmp(name, "config", 6)) ||
           (len == 4 && !strncmp(name, "help", 4) && !eq);
}

ms_status opts_parse(const opts_spec *spec, int n, void *dst, int argc, char **argv, char **pos,
                     int max_pos, int *n_pos, int *help) {
    enum { FROM_DEFAULT = 1, FROM_ENV, FROM_ARGV, FROM_CONFIG }; /* config files: +i */
    *n_pos = 0;
    *help = 0;
    for (int i = 0; i < n; i++)
        if (spec[i].type == OPT_T_LIST) list_clear((opts_list *)((char *)dst + spec[i].offset));
    for (int i = 0; i < n; i++) {
        MS_CHECKF(!spec[i].bare || spec[i].type == OPT_T_INT,
                  "option --%s: only an INT option may be given bare", spec[i].name);
        if (spec[i].def) MS_TRY(set_value(&spec[i], dst, spec[i].def, "default", FROM_DEFAULT));
    }
    /* the config file first, so the command line overrides it; its path
     * recorded where the table asks (opts_spec: a list named "config") */
    const opts_spec *cfg = find(spec, n, "config", 6);
    MS_CHECKF(!cfg || cfg->type == OPT_T_LIST, "option --config: the table's entry must be a list");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config") || !strncmp(a, "--config=", 9)) {
            const char *path = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!path) return ms_error(MS_ERR_ARG, "--config needs a file name");
            MS_TRY(load_config(spec, n, dst, path, FROM_CONFIG + i));
            if (cfg) MS_TRY(set_value(cfg, dst, path, "command line", FROM_CONFIG));
        }
    }
    for (int i = 0; i < n; i++) { /* then the environment */
        const char *v = spec[i].env ? getenv(spec[i].env) : NULL;
        if (v && *v) {
            char where[80];
            snprintf(where, sizeof where, "environment %s", spec[i].env);
            MS_TRY(set_value(&spec[i], dst, v, where, FROM_ENV));
        }
    }
    const opts_spec *prev = NULL; /* the option whose value was the last argument */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const opts_spec *last = prev;
        prev = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = 1;
            continue;
        }
        if (a[0] == '-' && a[1] && a[1] != '-' && !isdigit((unsigned char)a[1]) && a[1] != '.')
            return ms_error(MS_ERR_ARG, "unknown option '%s' (options start with --: --%s)", a,
                            a + 1);
        if (strncmp(a, "--", 2) != 0) {
            if (*n_pos < max_pos) {
                pos[(*n_pos)++] = argv[i];
                continue;
            }
            /* an unquoted glob (`--train-data dir/NAME_*`): the shell gave the option
             * the first file and left the others as arguments */
            if (last && (last->type == OPT_T_STR || last->type == OPT_T_LIST))
                return ms_error(MS_ERR_ARG,
                                "unexpected argument '%s' after --%s %s: if --%s was given a "
                                "glob, the shell expanded it into several files; quote the "
                                "pattern, as in --%s 'DIR/NAME_*'",
                                a, last->name, argv[i - 1], last->name, last->name);
            return ms_error(MS_ERR_ARG, "unexpected argument '%s'", a);
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (len == 6 && !strncmp(name, "config", 6)) {
            if (!eq) i++;
            continue;
        }
        const opts_spec *s = find(spec, n, name, len);
        if (!s) return ms_error(MS_ERR_ARG, "unknown option '%.*s' (see --help)", (int)len + 2, a);
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
        /* a yes/no word after a flag is meant as its value: said, not taken
         * for a positional argument (`--force yes` got the unquoted-glob hint) */
        static const char *const words[] = {"yes", "no", "true", "false", "on", "off", NULL};
        for (int k = 0; !eq && s->bare && v && words[k]; k++)
            if (!strcasecmp(v, words[k]))
                return ms_error(MS_ERR_ARG,
                                "option --%s takes 0 or 1 (or nothing: --%s alone is 1), not "
                                "'%s'",
                                s->name, s->name, v);
        if (!eq && s->bare && !(v && ms_str_is_integer(v)))
            v = "1"; /* a bare flag: the next argument is not its value */
        else if (!eq && v) {
            i++;
            prev = s; /* its value was the next argument */
        }
        if (!v) return ms_error(MS_ERR_ARG, "option --%s needs a value", s->name);
        if (!eq && names_option(spec, n, v)) /* `--out --force`: a forgotten value */
            return ms_error(MS_ERR_ARG,
                            "option --%s needs a value: the next argument, %s, is an option "
                            "(--%s=%s gives a value that starts with --)",
                            s->name, v, s->name, v);
        MS_TRY(set_value(s, dst, v, "command line", FROM_ARGV));
    }
    return MS_OK;
}

ms_status opts_check_dir(const opts_spec *spec, int n, const void *dst, const char *name,
                         const char *what) {
    const opts_spec *s = find(spec, n, name, strlen(name));
    MS_CHECKF(s && s->type == OPT_T_STR, "opts_check_dir: no string option --%s", name);
    const char *v = *(char *const *)((const char *)dst + s->offset);
    if (!v || !*v || (s->def && !strcmp(v, s->def))) return MS_OK;
    const char *env = s->env ? getenv(s->env) : NULL;
    char opt[160];
    if (env && !strcmp(env, v))
        snprintf(opt, sizeof opt, "--%s (env %s)", name, s->env);
    else
        snprintf(opt, sizeof opt, "--%s", name);
    return ms_path_check_dir(opt, v, what);
}

ms_status opts_check_output(const opts_spec *spec, int n, const void *dst, const char *opt,
                            const char *path, const char *const *names) {
    const opts_spec *s = find(spec, n, "config", 6);
    MS_CHECKF(s && s->type == OPT_T_LIST, "opts_check_output: the table records no --config files");
    const opts_list *cfg = (const opts_list *)((const char *)dst + s->offset);
    char match[4400];
    /* every command's, not train's alone: trace merge -o DIR/step_N/manifest.json replaced a
     * commit's manifest with a trace, and --png a shard with a picture */
    if (path && *path && ckpt_is_part(path, match, sizeof match))
        return ms_error(MS_ERR_ARG,
                        "%s %s is %s: an output never replaces a checkpoint's file; nothing was "
                        "written",
                        opt, path, match);
    for (int i = 0; path && *path && i < cfg->n; i++) {
        if (!names && ms_path_is_input(path, cfg->v[i], NULL, 0))
            return ms_error(MS_ERR_ARG,
                            "%s %s is the --config file %s: an output never replaces an input; "
                            "nothing was written",
                            opt, path, cfg->v[i]);
        if (names && ms_path_in_dir(cfg->v[i], path, names, match, sizeof match))
            return ms_error(MS_ERR_ARG,
                            "%s %s: the --config file %s is %s, a file the run writes there: an "
                            "output never replaces an input; nothing was written",
                            opt, path, cfg->v[i], match);
    }
    return MS_OK;
}

void opts_print_help(const opts_spec *spec, int n, const char *usage) {
    printf("%s\n\nOptions (also accepted as 'name = value' lines in --config FILE):\n", usage);
    for (int i = 0; i < n; i++) {
        if (!strcmp(spec[i].name, "config")) continue; /* the recorded --config files: below */
        const char *t = spec[i].type == OPT_T_STR      ? "STR"
                        : spec[i].type == OPT_T_LIST   ? "STR..."
                        : spec[i].type == OPT_T_DOUBLE ? "X"
                                                       : "N";
        char left[64];
        snprintf(left, sizeof left, spec[i].bare ? "--%s [%s]" : "--%s %s", spec[i].name, t);
        printf("  %-24s %s", left, spec[i].help);
        if (spec[i].def && *spec[i].def) printf(" [%s]", spec[i].def);
        if (spec[i].range) {
            char r[128];
            range_text(&spec[i], r, sizeof r);
            printf(" (%s)", r);
        }
        if (spec[i].env) printf(" (env %s)", spec[i].env);
        if (spec[i].type == OPT_T_LIST) printf(" (repeatable)");
        printf("\n");
    }
    printf("  %-24s %s\n", "--config FILE", "read options from FILE (command line wins)");
}

void opts_free(const opts_spec *spec, int n, void *dst) {
    for (int i = 0; i < n; i++)
        if (spec[i].type == OPT_T_STR) {
            char **sp = (char **)((char *)dst + spec[i].offset);
            free(*sp);
            *sp = NULL;
        } else if (spec[i].type == OPT_T_LIST) {
            list_clear((opts_list *)((char *)dst + spec[i].offset));
        }
}

/* Whether name is one of list (NULL-terminated, may be NULL). */
static int is_in(const char *name, const char *const *list) {
    for (int k = 0; list && list[k]; k++)
        if (!strcmp(name, list[k])) return 1;
    return 0;
}

/* The options as a JSON object's text; shared_only: those without
 * per_rank; secret: the options whose value is not written. */
static char *to_json(const opts_spec *spec, int n, const void *dst, int shared_only,
                     const char *const *secret) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < n; i++) {
        const void *p = (const char *)dst + spec[i].offset;
        if (shared_only && spec[i].per_rank) continue;
        if (!strcmp(spec[i].name, "config")) continue; /* which files gave them: no option */
        switch (spec[i].type) {
        case OPT_T_INT:
            cJSON_AddNumberToObject(o, spec[i].name, *(const int *)p);
            break;
        case OPT_T_U64:
            cJSON_AddNumberToObject(o, spec[i].name, (double)*(const uint64_t *)p);
            break;
        case OPT_T_DOUBLE:
            cJSON_AddNumberToObject(o, spec[i].name, *(const double *)p);
            break;
        case OPT_T_STR: {
            const char *v = *(char *const *)p;
            if (v)
                cJSON_AddStringToObject(o, spec[i].name,
                                        is_in(spec[i].name, secret) ? "(secret)" : v);
            else
                cJSON_AddNullToObject(o, spec[i].name);
            break;
        }
        case OPT_T_LIST: {
            const opts_list *l = p;
            cJSON *a = cJSON_AddArrayToObject(o, spec[i].name);
            for (int k = 0; a && k < l->n; k++)
                cJSON_AddItemToArray(a, cJSON_CreateString(l->v[k]));
            break;
        }
        }
    }
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return text;
}

char *opts_to_json(const opts_spec *spec, int n, const void *dst, const char *const *secret) {
    return to_json(spec, n, dst, 0, secret);
}

char *opts_to_json_shared(const opts_spec *spec, int n, const void *dst) {
    return to_json(spec, n, dst, 1, NULL);
}

/* One "name = value" line into *buf (grown as needed); 0 on OOM. */
static int cfg_line(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0) return 0;
    if (*len + (size_t)need + 1 > *cap) {
        size_t c = (*cap ? *cap * 2 : 4096) + (size_t)need;
        char *b = realloc(*buf, c);
        if (!b) return 0;
        *buf = b;
        *cap = c;
    }
    va_start(ap, fmt);
    vsnprintf(*buf + *len, *cap - *len, fmt, ap);
    va_end(ap);
    *len += (size_t)need;
    return 1;
}

/* The quote that lets the config parser read v back as it is: '"', or '\''
 * for a value holding a '#' and a '"' (load_config: a '#' inside the quotes
 * is part of the value, and the value ends at the first closing quote);
 * 0 when there is none (a line break or another control character, or a '#'
 * with both quotes). */
static char cfg_quote(const char *v) {
    for (const char *c = v; *c; c++)
        if ((unsigned char)*c < 0x20) return 0;
    if (!strchr(v, '#') || !strchr(v, '"')) return '"';
    return strchr(v, '\'') ? 0 : '\'';
}

/* "name = \"value\"", or a comment saying the value cannot be written. */
static int cfg_string(char **buf, size_t *len, size_t *cap, const char *nm, const char *v) {
    char q = cfg_quote(v);
    return q ? cfg_line(buf, len, cap, "%s = %c%s%c\n", nm, q, v, q)
             : cfg_line(buf, len, cap,
                        "# %s: a value holds a control character, or a '#' and both quotes, "
                        "which a config file cannot: give it on the command line\n",
                        nm);
}

char *opts_to_config(const opts_spec *spec, int n, const void *dst, const char *const *skip,
                     const char *header) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int good = cfg_line(&buf, &len, &cap, "%s", header ? header : "");
    for (int i = 0; good && i < n; i++) {
        int skipped = !strcmp(spec[i].name, "config");
        for (int k = 0; skip && skip[k]; k++)
            skipped |= !strcmp(spec[i].name, skip[k]);
        if (skipped) continue;
        const void *p = (const char *)dst + spec[i].offset;
        const char *nm = spec[i].name;
        if (!spec[i].def && ((spec[i].type == OPT_T_INT && *(const int *)p == 0) ||
                             (spec[i].type == OPT_T_U64 && *(const uint64_t *)p == 0) ||
                             (spec[i].type == OPT_T_DOUBLE && *(const double *)p == 0)))
            continue; /* a number without a default, not given (--dp: inferred) */
        switch (spec[i].type) {
        case OPT_T_INT:
            good = cfg_line(&buf, &len, &cap, "%s = %d\n", nm, *(const int *)p);
            break;
        case OPT_T_U64:
            good = cfg_line(&buf, &len, &cap, "%s = %llu\n", nm,
                            (unsigned long long)*(const uint64_t *)p);
            break;
        case OPT_T_DOUBLE:
            good = cfg_line(&buf, &len, &cap, "%s = %.17g\n", nm, *(const double *)p);
            break;
        case OPT_T_STR: {
            const char *v = *(char *const *)p;
            if (v) good = cfg_string(&buf, &len, &cap, nm, v); /* unset: the default */
            break;
        }
        case OPT_T_LIST: {
            const opts_list *l = p;
            for (int k = 0; good && k < l->n; k++)
                good = cfg_string(&buf, &len, &cap, nm, l->v[k]);
            break;
        }
        }
    }
    if (!good) {
        free(buf);
        return NULL;
    }
    return buf;
}
