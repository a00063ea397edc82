/* cmd_dashboard.c - `megascale dashboard RUN_DIR`: the dashboard of a
 * finished or running job, served from its run directory's files (the
 * pages and API of `megascale launch --dashboard`, without the driver's
 * live view), until SIGINT or SIGTERM. */
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "supervisor/sup_dash.h"

typedef struct {
    int port;
    char *bind;
    char *events;
} dash_cli;

static const opts_spec dash_opts[] = {
    {"port", OPT_T_INT, offsetof(dash_cli, port), "0", "the port (0: any free one)", NULL,
     "[0,65535]", 0, 0},
    {"bind", OPT_T_STR, offsetof(dash_cli, bind), "127.0.0.1",
     "the address (loopback unless you mean to show it to other hosts)", NULL, NULL, 0, 0},
    {"events", OPT_T_STR, offsetof(dash_cli, events), NULL,
     "the events JSONL, where the job's `launch --events` put it (default RUN_DIR/events.jsonl)",
     NULL, NULL, 0, 0},
};
#define N_DASH_OPTS ((int)(sizeof dash_opts / sizeof dash_opts[0]))

int cmd_dashboard(int argc, char **argv) {
    dash_cli o = {0};
    char *pos[2];
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(dash_opts, N_DASH_OPTS, &o, argc, argv, pos, 2, &npos, &help);
    struct stat sb;
    struct in_addr addr;
    if (help) {
        opts_print_help(dash_opts, N_DASH_OPTS,
                        "usage: megascale dashboard RUN_DIR [--port P] [--bind ADDR] "
                        "[--events PATH]\n\n"
                        "Serves the dashboard of the job whose `megascale launch --run-dir` "
                        "was RUN_DIR, from its files (events.jsonl, compute.jsonl and the "
                        "metrics the events name), live while it runs; prints the URL with "
                        "this server's token.  Ctrl-C stops it.");
    } else if (st != MS_OK) {
        rc = cli_fail("dashboard", st);
    } else if (npos != 1) {
        fprintf(stderr, "megascale dashboard: error: one RUN_DIR expected (see --help)\n");
        rc = 2;
    } else if (inet_pton(AF_INET, o.bind ? o.bind : "", &addr) != 1) {
        fprintf(stderr,
                "megascale dashboard: error: --bind '%s': expected a numeric IPv4 address\n",
                o.bind ? o.bind : "");
        rc = 2;
    } else if (ms_path_check_dir("RUN_DIR", pos[0], NULL) != MS_OK) {
        fprintf(stderr, "megascale dashboard: error: %s\n", ms_errmsg());
        rc = 3;
    } else if (o.events && *o.events && stat(o.events, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr,
                "megascale dashboard: error: --events %s is a directory, not a file (the "
                "events JSONL of `megascale launch`)\n",
                o.events);
        rc = 2;
    } else {
        char events[4200];
        if (o.events && *o.events)
            snprintf(events, sizeof events, "%s", o.events);
        else
            snprintf(events, sizeof events, "%s/events.jsonl", pos[0]);
        char metrics[4300];
        snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", pos[0]);
        if (access(events, R_OK) != 0 && !(o.events && *o.events) && access(metrics, R_OK) == 0)
            fprintf(stderr,
                    "megascale dashboard: %s: no events file: a run without `megascale "
                    "launch`; its curves and state come from %s\n",
                    events, metrics);
        else if (access(events, R_OK) != 0)
            fprintf(stderr,
                    "megascale dashboard: warning: %s: no events file (yet): is RUN_DIR "
                    "the --run-dir of a `megascale launch` (and --events its --events)?\n",
                    events);
        sup_dash *d = NULL;
        char why[512];
        sup_dash_config c = {pos[0], o.bind, o.port, 0, o.events};
        /* Ctrl-C and SIGTERM blocked before the server's threads start (they inherit it),
         * then taken by sigwait: a signal can neither land on a server thread and leave this
         * one waiting, nor come between a check and a pause() */
        sigset_t stop;
        sigemptyset(&stop);
        sigaddset(&stop, SIGINT);
        sigaddset(&stop, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &stop, NULL);
        if (sup_dash_start(&d, &c, why, sizeof why) != 0) {
            fprintf(stderr, "megascale dashboard: error: %s\n", why);
            rc = 1;
        } else {
            printf("megascale dashboard: %s\n", sup_dash_url(d));
            fflush(stdout);
            int sig = 0;
            while (sigwait(&stop, &sig) != 0)
                ;
            sup_dash_stop(d);
        }
    }
    opts_free(dash_opts, N_DASH_OPTS, &o);
    return rc;
}
