/* cmd_launch.c - `megascale launch [launch options] -- [train options]`:
 * the supervisor (src/supervisor/sup.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "supervisor/sup.h"

typedef struct {
    int np, nodes, spares, max_restarts, no_progress, diag, straggler_rounds, ckpt_fail_limit;
    int preflight, diag_peers;
    int dashboard;
    double hb_timeout, progress_factor, startup_timeout, grace, backoff;
    double diag_timeout, diag_slow_factor, straggler_score, loss_spike_z, compute_log_max_mb;
    char *run_dir, *events, *hostfile, *mpirun, *bin, *bind, *faults, *dashboard_bind;
    opts_list config; /* the --config files read (an input: never --events) */
} launch_cli;

#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(launch_cli, field), def, help, NULL, NULL, 0, 0 }
/* With the values allowed (cli/opts.h): a timing of 0 or below, or a count
 * out of range, is a usage error naming the option, not a job that hangs
 * or sleeps for ever. */
#define R(name, type, field, def, range, help)                                                     \
    { name, type, offsetof(launch_cli, field), def, help, NULL, range, 0, 0 }

static const opts_spec launch_opts[] = {
    R("np", OPT_T_INT, np, "1", "[1,1048576]", "ranks of the job"),
    /* default 0, not 1: an explicit --nodes 1 with --hostfile must be told
     * from "not given" (then every host but the spares is a node) */
    R("nodes", OPT_T_INT, nodes, "0", "[0,1024]",
      "split the ranks into N nodes (0: one on this host; with --hostfile, every host but the "
      "spares), contiguous ranks, named in events"),
    R("spares", OPT_T_INT, spares, "0", "[0,1023]",
      "nodes held back: one takes the place of each node the driver evicts"),
    O("hostfile", OPT_T_STR, hostfile, NULL, "mpirun's hostfile (real hosts; use --bind too)"),
    O("run-dir", OPT_T_STR, run_dir, NULL, "the driver's directory: events.jsonl (required)"),
    O("events", OPT_T_STR, events, NULL, "the events JSONL (default RUN_DIR/events.jsonl)"),
    R("max-restarts", OPT_T_INT, max_restarts, "10", "[0,)", "restarts before giving up (exit 3)"),
    R("no-progress-restarts", OPT_T_INT, no_progress, "3", "[1,)",
      "restarts in a row without a new step before stopping (exit 4: do not requeue)"),
    R("heartbeat-timeout", OPT_T_DOUBLE, hb_timeout, "30", "[2,86400]",
      "seconds without a beat from a rank before it is declared hung"),
    R("progress-factor", OPT_T_DOUBLE, progress_factor, "5", "[1,1000]",
      "hung when no new step for this many times the longest step of the last 1000 to 2000 "
      "(at least the heartbeat timeout)"),
    R("startup-timeout", OPT_T_DOUBLE, startup_timeout, "600", "[1,604800]",
      "seconds from a launch to every rank's first step"),
    R("grace", OPT_T_DOUBLE, grace, "10", "[0,3600]",
      "seconds between the stop request (the ranks take a final checkpoint) and SIGTERM to "
      "mpirun (SIGKILL 5 s later)"),
    R("backoff", OPT_T_DOUBLE, backoff, "1", "[0,30]",
      "seconds before a restart (doubled for each restart in a row without progress, <= 30)"),
    R("diag", OPT_T_INT, diag, "1", "[0,1]",
      "run `megascale diag` on every node after a fault and evict the nodes that fail (0: off)"),
    R("diag-timeout", OPT_T_DOUBLE, diag_timeout, "120", "[1,86400]",
      "seconds the self-test may take; a node without a report by then fails"),
    R("diag-slow-factor", OPT_T_DOUBLE, diag_slow_factor, "0.5", "[0,1]",
      "a node fails the self-test below this fraction of its own history's GEMM or memory "
      "speed (RUN_DIR/diag/NODE.jsonl, 3 runs or more; only with --hostfile: on one host it "
      "is the host's), or of the other nodes' median (--diag-peers), in two measurements"),
    R("diag-peers", OPT_T_INT, diag_peers, "-1", "[-1,1]",
      "compare the nodes' GEMM and memory speeds with each other's in the self-test (1: on; "
      "0: off; -1: with --hostfile, as nodes on one host share its processors)"),
    R("preflight", OPT_T_INT, preflight, "0", "[0,1]",
      "1: run the self-test on every node (the spares too) before the first start and evict "
      "the ones that fail, so a node broken or slow from the start never joins (with --diag 1)"),
    R("straggler-score", OPT_T_DOUBLE, straggler_score, "0.6", "(0,1]",
      "a straggler computes at less than this fraction of the other ranks' median speed..."),
    R("straggler-rounds", OPT_T_INT, straggler_rounds, "10", "[0,)",
      "...for this many steps in a row; its node is evicted when a spare can replace it (0: "
      "off)"),
    R("loss-spike-z", OPT_T_DOUBLE, loss_spike_z, "6", "[0,)",
      "a loss this many standard deviations above the last 32 steps is a spike (an anomaly "
      "event; 0: off)"),
    R("ckpt-fail-limit", OPT_T_INT, ckpt_fail_limit, "2", "[1,)",
      "checkpoints failing to commit in a row (disk full, I/O errors) before the job is stopped "
      "and the storage checked; fewer: the job goes on and retries"),
    {"dashboard", OPT_T_INT, offsetof(launch_cli, dashboard), "-1",
     "serve the live dashboard on this port (0: any free one; it prints the URL with the job's "
     "token, also in RUN_DIR/dashboard.json; -1: off)",
     NULL, "[-1,65535]", 0, 0},
    O("dashboard-bind", OPT_T_STR, dashboard_bind, "127.0.0.1",
      "the dashboard's address (loopback unless you mean to show it to other hosts)"),
    R("compute-log-max-mb", OPT_T_DOUBLE, compute_log_max_mb, "256", "[0,1048576]",
      "RUN_DIR/compute.jsonl (every rank's compute time per step) past this many MB is renamed "
      "compute.jsonl.1, replacing the older one, and started again (0: unbounded)"),
    O("mpirun", OPT_T_STR, mpirun, "mpirun", "the mpirun to launch with"),
    O("bin", OPT_T_STR, bin, NULL, "the megascale binary of the ranks (default: this one)"),
    O("bind", OPT_T_STR, bind, "127.0.0.1", "heartbeat address (loopback unless hosts need it)"),
    O("faults", OPT_T_STR, faults, NULL,
      "chaos: a fault plan (--inject-fault's syntax, e.g. random=SEED/N/MAXSTEP/WORLD); each "
      "start gets the faults still ahead"),
    OPTS_CONFIG_FILES(launch_cli, config),
};
#define N_LAUNCH_OPTS ((int)(sizeof launch_opts / sizeof launch_opts[0]))

/* An address option: a numeric IPv4 address (the sockets bind to it), else
 * a usage error naming the option; 0 or SUP_EXIT_USAGE. */
static int check_addr(const char *opt, const char *v) {
    struct in_addr a;
    if (!v || inet_pton(AF_INET, v, &a) == 1) return 0;
    fprintf(stderr, "megascale launch: error: %s '%s': expected a numeric IPv4 address\n", opt, v);
    return SUP_EXIT_USAGE;
}

/* The events file the driver appends to: --events, or RUN_DIR/events.jsonl
 * (into buf, cap bytes; NULL without either).  *opt: how the messages name
 * it. */
static const char *events_path(const launch_cli *o, char *buf, size_t cap, const char **opt) {
    *opt = "launch --events";
    if (o->events && *o->events) return o->events;
    *opt = "launch --run-dir's events file";
    if (!o->run_dir || !*o->run_dir) return NULL;
    snprintf(buf, cap, "%s/events.jsonl", o->run_dir);
    return buf;
}

/* The input the events file is, if it is one (NULL if none): the binary
 * or the hostfile, which appended to would not run or parse again (a
 * --config file: opts_check_output). */
static const char *events_input(const launch_cli *o, const char *events, const char *bin) {
    if (ms_path_is_input(events, bin, NULL, 0)) return "megascale binary";
    if (ms_path_is_input(events, o->hostfile, NULL, 0)) return "--hostfile";
    return NULL;
}

/* What the driver writes in RUN_DIR besides its events (and the metrics, when it adds
 * --metrics RUN_DIR/metrics.jsonl to the train options: the last name). */
static const char *const driver_files[] = {"driver.json",
                                           "driver.lock",
                                           "compute.jsonl",
                                           "compute.jsonl.1",
                                           "control.json",
                                           "dashboard.json",
                                           "blocklist.json",
                                           "hostfile.active",
                                           "peak-*.json",
                                           "metrics.jsonl",
                                           NULL};

/* The paths the driver writes or runs, checked before anything starts:
 * --run-dir a directory it can make, --events a file it can write, the
 * events file (ev_opt events: events_path) not an input (events_input, a
 * --config file), --bin an executable file (else every start of the job
 * fails, and is restarted as a fault).  0 or SUP_EXIT_USAGE, the error
 * naming the option. */
static int check_paths(const launch_cli *o, const char *ev_opt, const char *events,
                       int own_metrics) {
    ms_status st = MS_OK;
    struct stat sb;
    const char *bin = o->bin && *o->bin ? o->bin : "/proc/self/exe"; /* stat: the binary */
    const char *in = events_input(o, events, bin);
    char match[64];
    int n_names = (int)(sizeof driver_files / sizeof driver_files[0]) - (own_metrics ? 1 : 2);
    const char *names[sizeof driver_files / sizeof driver_files[0]];
    for (int i = 0; i < n_names; i++)
        names[i] = driver_files[i];
    names[n_names] = NULL;
    if (o->run_dir && *o->run_dir && (st = ms_path_check_writable(o->run_dir, 1)) != MS_OK)
        st = ms_error_wrap(st, "--run-dir");
    else if (o->events && *o->events && (st = ms_path_check_writable(o->events, 0)) != MS_OK)
        st = ms_error_wrap(st, "--events");
    else if (in)
        st = ms_error(MS_ERR_ARG,
                      "%s %s is the %s: an output never replaces an input; nothing was written",
                      ev_opt, events, in);
    else if (o->events && *o->events &&
             ms_path_named_in_dir(o->events, o->run_dir, names, match, sizeof match))
        st = ms_error(MS_ERR_ARG,
                      "--events %s is named as %s, a file the job writes in --run-dir %s: "
                      "the two would go into one file; nothing was written",
                      o->events, match, o->run_dir);
    else if ((st = opts_check_output(launch_opts, N_LAUNCH_OPTS, o, ev_opt, events, NULL)) !=
             MS_OK) {
    } else if (o->bin && *o->bin && stat(o->bin, &sb) != 0)
        st = ms_error(MS_ERR_ARG, "--bin %s: %s (the megascale binary of the ranks)", o->bin,
                      errno == ENOENT ? "does not exist" : strerror(errno));
    else if (o->bin && *o->bin && (!S_ISREG(sb.st_mode) || access(o->bin, X_OK) != 0))
        st = ms_error(MS_ERR_ARG, "--bin %s is %san executable file (the megascale binary)", o->bin,
                      S_ISDIR(sb.st_mode) ? "a directory, not " : "not ");
    return st == MS_OK ? 0 : cli_fail("launch", st);
}

int cmd_launch(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "--ctl")) { /* a command to a running driver */
        if (argc < 3) {
            fprintf(stderr, "usage: megascale launch --ctl RUN_DIR evict NODE | status | dump\n");
            return SUP_EXIT_USAGE;
        }
        return sup_ctl_client(argv[1], argc - 2, argv + 2);
    }
    int sep = argc;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            sep = i;
            break;
        }
    launch_cli o = {0};
    static cli_train_view tv; /* large: not on the stack */
    char *pos[1];
    int npos, help;
    ms_status st = opts_parse(launch_opts, N_LAUNCH_OPTS, &o, sep, argv, pos, 0, &npos, &help);
    int rc = 0;
    char self[4096] = "", evbuf[4200];
    const char *ev_opt, *events = events_path(&o, evbuf, sizeof evbuf, &ev_opt);
    if (help) {
        opts_print_help(
            launch_opts, N_LAUNCH_OPTS,
            "usage: megascale launch --np N --run-dir DIR [options] -- "
            "--ckpt-dir DIR [train options]\n"
            "       megascale launch --ctl RUN_DIR evict NODE | status | dump\n\n"
            "Starts `megascale train` under mpirun, watches its heartbeats, and restarts "
            "it from its newest checkpoint after a crash, a hang, a persistent NaN or a "
            "straggler, running `megascale diag` on the nodes and replacing the ones that fail "
            "with spares.  Run the same command again after the driver itself died: it takes "
            "over from RUN_DIR.\nExit codes: 0 done, 1 driver error, 2 usage, 3 restart budget "
            "spent, 4 no progress (do not requeue), 5 stopped by a signal, 6 too few healthy "
            "nodes, 7 the checkpoint storage fails on every node.");
    } else if (st != MS_OK) {
        /* a train option before the "--" (or with none): said, with where it goes */
        const char *bad = NULL;
        for (int i = 0; i < sep && !bad; i++)
            if (!strncmp(ms_errmsg(), "unknown option '", 16) && !strncmp(argv[i], "--", 2) &&
                !strncmp(ms_errmsg() + 16, argv[i], strcspn(argv[i], "=")) &&
                ms_errmsg()[16 + strcspn(argv[i], "=")] == '\'' && /* the whole name */
                cmd_train_has_option(argv[i] + 2, strcspn(argv[i] + 2, "=")))
                bad = argv[i];
        if (bad)
            fprintf(stderr,
                    "megascale launch: error: %.*s is a train option: put the train options "
                    "after '--' (megascale launch --np N --run-dir DIR [launch options] -- "
                    "[train options])\n",
                    (int)strcspn(bad, "="), bad);
        rc = bad ? 2 : cli_fail("launch", st);
    } else if (sep == argc) {
        fprintf(stderr, "megascale launch: error: no train options: put them after '--' "
                        "(see megascale launch --help)\n");
        rc = 2;
    } else if ((rc = check_addr("--bind", o.bind)) ||
               (rc = check_addr("--dashboard-bind", o.dashboard_bind))) {
    } else if ((rc = cmd_train_check(argc - sep - 1, argv + sep + 1, ev_opt, events, o.run_dir,
                                     driver_files, &tv)) != 0) {
    } else if ((rc = check_paths(&o, ev_opt, events, !*tv.metrics)) != 0) {
    } else {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) self[n] = 0;
        sup_config c = {.np = o.np,
                        .nodes = o.nodes,
                        .spares = o.spares,
                        .diag = o.diag,
                        .diag_timeout = o.diag_timeout,
                        .diag_slow_factor = o.diag_slow_factor,
                        .diag_peers = o.diag_peers,
                        .preflight = o.preflight,
                        .straggler_score = o.straggler_score,
                        .straggler_rounds = o.straggler_rounds,
                        .loss_spike_z = o.loss_spike_z,
                        .ckpt_fail_limit = o.ckpt_fail_limit,
                        .dashboard_port = o.dashboard,
                        .dashboard_bind = o.dashboard_bind,
                        .compute_log_max_bytes = (uint64_t)(o.compute_log_max_mb * 1e6),
                        .hostfile = o.hostfile,
                        .max_restarts = o.max_restarts,
                        .hb_timeout = o.hb_timeout,
                        .progress_factor = o.progress_factor,
                        .startup_timeout = o.startup_timeout,
                        .grace = o.grace,
                        .backoff = o.backoff,
                        .no_progress_limit = o.no_progress,
                        .run_dir = o.run_dir,
                        .events = o.events && *o.events ? o.events : NULL, /* "": the default */
                        .mpirun = o.mpirun,
                        .bin = o.bin && *o.bin ? o.bin : self,
                        .bind = o.bind,
                        .faults = o.faults,
                        .train_argc = argc - sep - 1,
                        .train_argv = argv + sep + 1,
                        .train_effective = tv.effective,
                        .ckpt_dir = tv.ckpt_dir,
                        .resume = tv.resume,
                        .new_run = tv.new_run,
                        .steps = tv.steps,
                        .ckpt_every = tv.ckpt_every,
                        .ckpt_every_min = tv.ckpt_every_min,
                        .metrics = tv.metrics,
                        .trace_dir = tv.trace_dir,
                        .peak_cache_given = tv.peak_cache_given,
                        .device = tv.device};
        rc = sup_run(&c);
    }
    free(tv.effective);
    tv.effective = NULL;
    opts_free(launch_opts, N_LAUNCH_OPTS, &o);
    return rc;
}
