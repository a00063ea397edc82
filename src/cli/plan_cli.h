/* plan_cli.h - shared by the files of `megascale plan` (cmd_plan.c, the
 * report with the scale-out section in cmd_plan_report.c, and `plan
 * measure` in cmd_plan_measure.c). */
#ifndef CLI_PLAN_CLI_H
#define CLI_PLAN_CLI_H

#include <stdio.h>

#include "plan/plan.h"

typedef struct {
    double mtbf_hours; /* of one node */
    double restart_s;
    int ckpt_every; /* steps; 0: Young/Daly's optimum */
} plan_scale_args;

/* Print the prediction (text: the breakdown, then the scale-out costs;
 * json: one object with "scale" added).  Returns the exit code. */
int plan_cli_report(FILE *f, int json, const plan_model *m, const plan_layout *l,
                    const plan_cluster *c, const plan_result *r, const plan_scale_args *sa);

int cmd_plan_measure(int argc, char **argv);

#endif
