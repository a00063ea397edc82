/* cmd_trace.c - `megascale trace`: merge a run's per-rank event logs into
 * one Chrome / Perfetto trace, score stragglers (table, JSON, heat map),
 * and analyse hang dumps (src/trace/trace.h). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "trace/trace.h"

typedef struct {
    char *out, *png;
    int json, window;
    double threshold;
    opts_list config; /* the --config files read (opts_check_output) */
} trace_cli;

#define O(n, t, field, d, h)                                                                       \
    { .name = n, .type = t, .offset = offsetof(trace_cli, field), .def = d, .help = h }
#define R(n, t, field, d, r, h)                                                                    \
    { .name = n, .type = t, .offset = offsetof(trace_cli, field), .def = d, .help = h, .range = r }
static const opts_spec trace_opts[] = {
    O("out", OPT_T_STR, out, NULL, "merge: the output file (also -o FILE) [DIR/trace.json]"),
    OPTS_FLAG("json", trace_cli, json,
              "stragglers, hang: 1 prints only JSON on stdout (a bare --json means 1)"),
    O("png", OPT_T_STR, png, NULL, "stragglers: also write a heat map PNG to this file"),
    R("threshold", OPT_T_DOUBLE, threshold, "0.75", "(0,1]",
      "stragglers: a relative or individual score below this marks a straggler"),
    R("window", OPT_T_INT, window, "5", "[1,100000]",
      "stragglers: steps per window of the individual score"),
    OPTS_CONFIG_FILES(trace_cli, config),
};
#define N_TRACE_OPTS ((int)(sizeof trace_opts / sizeof trace_opts[0]))

static const char *usage_text =
    "usage: megascale trace <command> DIR [options]\n\n"
    "  merge DIR [-o FILE]       one Chrome Trace Event file of all ranks' event logs\n"
    "                            (DIR/events_r*.jsonl): open it in ui.perfetto.dev\n"
    "  stragglers DIR [--json] [--png FILE] [--threshold X] [--window N]\n"
    "                            per-rank compute time per step (fwd + bwd minus the waits\n"
    "                            inside them), relative and individual scores\n"
    "  hang DIR [--json]         who waits in what, and the suspects, from DIR/hang_r*.json\n"
    "DIR is the directory the ranks wrote their event logs and hang dumps into.";

/* Whether path names a file directly in directory dir (by identity, whatever the spelling)
 * by a name the tools read as the run's (trace_is_input_name), existing or not. */
static int named_as_input(const char *path, const char *dir) {
    char parent[4400];
    struct stat sp, sd;
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (snprintf(parent, sizeof parent, "%.*s", (int)(slash - path + (slash == path)), path) >=
             (int)sizeof parent)
        return 0;
    return trace_is_input_name(base) && stat(parent, &sp) == 0 && stat(dir, &sd) == 0 &&
           sp.st_dev == sd.st_dev && sp.st_ino == sd.st_ino;
}

/* An output (opt PATH), before the work: a file that can be written and is
 * not one of the run's files the tools read (an event log, its rotated
 * .1, a hang dump, the supervisor's hang_driver.json) nor named as one in
 * DIR (every later read would take it for the run's), nor a --config file
 * of the command (o), which it would replace. */
static ms_status check_output(const trace_cli *o, const char *opt, const char *path,
                              const char *dir) {
    static const char *const read[] = {"events_r*.jsonl", "events_r*.jsonl.1", "hang_r*.json",
                                       "hang_driver.json", NULL};
    char match[4400];
    ms_status st = ms_path_check_replaceable(path); /* written whole, renamed into place */
    if (st != MS_OK) return ms_error_wrap(st, "%s", opt);
    if (ms_path_in_dir(path, dir, read, match, sizeof match))
        return ms_error(MS_ERR_ARG,
                        "%s %s is %s, a file of the run that this command reads: an output "
                        "never replaces an input; nothing was written",
                        opt, path, match);
    if (named_as_input(path, dir))
        return ms_error(MS_ERR_ARG,
                        "%s %s is named as a file of the run in %s (events_rNNNNN.jsonl[.1|.new], "
                        "hang_rNNNNN.json, hang_driver.json): every later read would take it "
                        "for one; an output never replaces an input; nothing was written",
                        opt, path, dir);
    return opts_check_output(trace_opts, N_TRACE_OPTS, o, opt, path, NULL);
}

static ms_status do_merge(const char *dir, const trace_cli *o) {
    char def[4300];
    snprintf(def, sizeof def, "%s/trace.json", dir);
    const char *out = o->out && *o->out ? o->out : def;
    /* before the merge, not after it: the run's logs can take minutes to read
     * (the default, inside DIR, after DIR is found) */
    if (o->out && *o->out)
        MS_TRY(check_output(o, "--out", out, dir));
    else
        MS_TRY(opts_check_output(trace_opts, N_TRACE_OPTS, o, "merge's default --out", out, NULL));
    trace_merge_stats s;
    MS_TRY(trace_merge(dir, out, &s));
    printf("merged %d rank(s), %lld events, %lld flow(s) (%lld unmatched send(s), %lld unmatched "
           "recv(s)), clock skew +-%.3f us, %lld dropped event(s) -> %s\n",
           s.ranks, (long long)s.events, s.flows, s.unmatched_sends, s.unmatched_recvs, s.skew_us,
           (long long)s.dropped, out);
    return MS_OK;
}

static ms_status print_json(cJSON *j) {
    if (!j) return ms_error(MS_ERR_NOMEM, "out of memory building the JSON report");
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    if (!txt) return ms_error(MS_ERR_NOMEM, "out of memory printing the JSON report");
    printf("%s\n", txt);
    free(txt);
    return MS_OK;
}

static ms_status do_stragglers(const char *dir, const trace_cli *o) {
    trace_strag_opts so = {o->threshold, o->window, o->png && *o->png};
    trace_strag *s = NULL;
    if (o->png && *o->png) MS_TRY(check_output(o, "--png", o->png, dir));
    MS_TRY(trace_strag_load(dir, &so, &s));
    ms_status st = MS_OK;
    if (o->png && *o->png) st = trace_strag_heatmap(s, o->png);
    if (st == MS_OK && o->json)
        st = print_json(trace_strag_json(s));
    else if (st == MS_OK)
        trace_strag_print(s, stdout);
    if (st == MS_OK && o->png && *o->png && !o->json) printf("heat map: %s\n", o->png);
    trace_strag_free(s);
    return st;
}

static ms_status do_hang(const char *dir, const trace_cli *o) {
    trace_hang *h = NULL;
    MS_TRY(trace_hang_load(dir, &h));
    ms_status st = MS_OK;
    if (o->json)
        st = print_json(trace_hang_json(h));
    else
        trace_hang_print(h, stdout);
    trace_hang_free(h);
    return st;
}

/* The shorthand the option table cannot express: "-o FILE" is "--out
 * FILE".  av has argc slots. */
static void expand_short(int argc, char **argv, char **av) {
    for (int i = 0; i < argc; i++)
        av[i] = strcmp(argv[i], "-o") ? argv[i] : "--out";
}

int cmd_trace(int argc, char **argv) {
    trace_cli o = {0};
    char *pos[2] = {NULL, NULL}, **av = calloc((size_t)argc + 1, sizeof *av);
    int npos = 0, help = 0, rc = 0;
    if (!av) return cli_fail("trace", ms_error(MS_ERR_NOMEM, "out of memory"));
    expand_short(argc, argv, av);
    ms_status st = opts_parse(trace_opts, N_TRACE_OPTS, &o, argc, av, pos, 2, &npos, &help);
    free(av);
    if (help || (st == MS_OK && npos == 0)) {
        opts_print_help(trace_opts, N_TRACE_OPTS, usage_text);
        opts_free(trace_opts, N_TRACE_OPTS, &o);
        return help ? 0 : 2;
    }
    const char *cmd = pos[0], *dir = npos > 1 ? pos[1] : NULL;
    if (st == MS_OK && !dir)
        st = ms_error(MS_ERR_ARG,
                      "trace %s: expected a run directory DIR (see megascale trace "
                      "--help)",
                      cmd);
    if (st != MS_OK) {
        /* fall through to the error */
    } else if (!strcmp(cmd, "merge")) {
        st = do_merge(dir, &o);
    } else if (!strcmp(cmd, "stragglers")) {
        st = do_stragglers(dir, &o);
    } else if (!strcmp(cmd, "hang")) {
        st = do_hang(dir, &o);
    } else {
        st = ms_error(MS_ERR_ARG, "unknown trace command '%s' (merge, stragglers, hang)", cmd);
    }
    if (st != MS_OK) rc = cli_fail("trace", st);
    opts_free(trace_opts, N_TRACE_OPTS, &o);
    return rc;
}
