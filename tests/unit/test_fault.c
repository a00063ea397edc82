/* test_fault.c - unit tests for the fault-injection registry (base/fault.c)
 * and node maps (base/node.c): parse / format / find round trips with rank
 * and node targets, the spike kind, the slow kind's sleep, and the errors,
 * each naming the entry at fault. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/node.h"
#include "base/timeutil.h"
#include "check.h"

#define WHAT "--inject-fault"

/* Exact string equality, both sides printed on mismatch. */
#define T_STR_EQ(a, b)                                                                             \
    do {                                                                                           \
        const char *ta_ = (a), *tb_ = (b);                                                         \
        if (!strcmp(ta_, tb_))                                                                     \
            ms_t_pass++;                                                                           \
        else {                                                                                     \
            ms_t_fail++;                                                                           \
            fprintf(stderr, "%s:%d: FAIL: %s == %s (\"%s\" vs \"%s\")\n", __FILE__, __LINE__, #a,  \
                    #b, ta_, tb_);                                                                 \
        }                                                                                          \
    } while (0)

/* Parsing spec must fail with MS_ERR_ARG and a message holding each needle. */
static void expect_bad(const char *spec, const char *needle1, const char *needle2) {
    ms_fault_plan p = {.n = 0};
    ms_status st = ms_fault_parse(&p, spec, WHAT);
    T_EQ_INT(st, MS_ERR_ARG);
    if (st != MS_OK) {
        T_STR_CONTAINS(ms_errmsg(), needle1);
        if (needle2) T_STR_CONTAINS(ms_errmsg(), needle2);
    }
}

static int same_fault(const ms_fault *a, const ms_fault *b) {
    return !strcmp(a->kind, b->kind) && a->arg == b->arg && a->step == b->step &&
           a->from == b->from && a->rank == b->rank && !strcmp(a->node, b->node);
}

static void test_parse_targets(void) {
    ms_fault_plan p = {.n = 0};
    const char *spec = "exit@2:node=b,nan-grad@3+:1,slow=12.5@4,spike=2.5@5,"
                       "stage2:after-shard@6:node=n-1.x_Y,diag:gemm:node=node1";
    T_EQ_INT(ms_fault_parse(&p, spec, WHAT), MS_OK);
    T_EQ_INT(p.n, 6);
    T_STR_EQ(p.f[0].kind, "exit");
    T_STR_EQ(p.f[0].node, "b");
    T_EQ_INT(p.f[0].step, 2);
    T_EQ_INT(p.f[0].rank, -1);
    T_STR_EQ(p.f[1].kind, "nan-grad");
    T_EQ_INT(p.f[1].from, 1);
    T_EQ_INT(p.f[1].rank, 1);
    T_STR_EQ(p.f[1].node, "");
    T_NEAR(p.f[2].arg, 12.5, 0);
    T_STR_EQ(p.f[3].kind, "spike");
    T_NEAR(p.f[3].arg, 2.5, 0);
    T_EQ_INT(p.f[3].rank, -1);
    T_STR_EQ(p.f[4].kind, "stage2:after-shard");
    T_STR_EQ(p.f[4].node, "n-1.x_Y");
    T_STR_EQ(p.f[5].kind, "diag:gemm"); /* a kind with ':' and a node target, no step */
    T_STR_EQ(p.f[5].node, "node1");
    T_EQ_INT(p.f[5].step, -1);

    /* format writes every entry back; parsing that gives the same plan */
    char buf[1024];
    ms_fault_format(&p, 0, buf, sizeof buf);
    T_STR_EQ(buf, spec);
    ms_fault_plan q = {.n = 0};
    T_EQ_INT(ms_fault_parse(&q, buf, WHAT), MS_OK);
    T_EQ_INT(q.n, p.n);
    for (int i = 0; i < p.n && i < q.n; i++)
        T_OK(same_fault(&p.f[i], &q.f[i]));
    /* the faults already met are left out; "+" and step-less entries stay */
    ms_fault_format(&p, 4, buf, sizeof buf);
    T_STR_EQ(buf, "nan-grad@3+:1,spike=2.5@5,stage2:after-shard@6:node=n-1.x_Y,"
                  "diag:gemm:node=node1");
    /* an argument keeps every bit through the round trip */
    ms_fault_plan r = {.n = 0};
    T_EQ_INT(ms_fault_parse(&r, "spike=1.2345678901234567@3", WHAT), MS_OK);
    ms_fault_format(&r, 0, buf, sizeof buf);
    ms_fault_plan r2 = {.n = 0};
    T_EQ_INT(ms_fault_parse(&r2, buf, WHAT), MS_OK);
    T_OK(r2.n == 1 && r2.f[0].arg == r.f[0].arg);
}

static void test_find_node(void) {
    ms_fault_plan p = {.n = 0};
    T_EQ_INT(ms_fault_parse(&p, "exit@2:node=b,kill@3:1,hang@4", WHAT), MS_OK);
    /* no node set: a node-targeted entry never fires */
    T_OK(!ms_fault_find(&p, "exit", 2, 0));
    T_OK(!ms_fault_any(&p, "exit", 0));
    ms_fault_plan_set_node(&p, "a");
    T_OK(!ms_fault_find(&p, "exit", 2, 0) && !ms_fault_find(&p, "exit", 2, 1));
    T_OK(!ms_fault_any(&p, "exit", 1));
    ms_fault_plan_set_node(&p, "b");
    T_OK(ms_fault_find(&p, "exit", 2, 0) && ms_fault_find(&p, "exit", 2, 7)); /* any rank of b */
    T_OK(!ms_fault_find(&p, "exit", 3, 0));
    T_OK(ms_fault_any(&p, "exit", 5));
    /* rank targets and untargeted entries do not depend on the node */
    T_OK(ms_fault_find(&p, "kill", 3, 1) && !ms_fault_find(&p, "kill", 3, 0));
    T_OK(ms_fault_find(&p, "hang", 4, 3));
    ms_fault_plan_set_node(&p, NULL);
    T_STR_EQ(p.self_node, "");
    T_OK(!ms_fault_find(&p, "exit", 2, 0) && ms_fault_find(&p, "hang", 4, 0));
    /* a prefix of the name is not the name */
    ms_fault_plan_set_node(&p, "bb");
    T_OK(!ms_fault_find(&p, "exit", 2, 0));
}

/* Without a step: the trainer's kinds fire at step 1 (they never fired), the checkpoint's
 * and the self-test's keep "no step"; KIND:RANK needs no step ("exit:1" was an unknown
 * fault), the kind's own ':' kept. */
static void test_no_step(void) {
    ms_fault_plan p = {.n = 0};
    T_EQ_INT(ms_fault_parse(&p,
                            "exit,kill:1,stage1:mid:1,stage2:after-commit,diag:gemm:2,"
                            "slow=5:0,io:noexchange",
                            WHAT),
             MS_OK);
    T_EQ_INT(p.n, 7);
    T_OK(!strcmp(p.f[0].kind, "exit") && p.f[0].step == 1 && p.f[0].rank == -1);
    T_OK(!strcmp(p.f[1].kind, "kill") && p.f[1].step == 1 && p.f[1].rank == 1);
    T_OK(!strcmp(p.f[2].kind, "stage1:mid") && p.f[2].step == -1 && p.f[2].rank == 1);
    T_OK(!strcmp(p.f[3].kind, "stage2:after-commit") && p.f[3].step == -1 && p.f[3].rank == -1);
    T_OK(!strcmp(p.f[4].kind, "diag:gemm") && p.f[4].step == -1 && p.f[4].rank == 2);
    T_OK(!strcmp(p.f[5].kind, "slow") && p.f[5].arg == 5 && p.f[5].step == 1 && p.f[5].rank == 0);
    T_OK(!strcmp(p.f[6].kind, "io:noexchange") && p.f[6].rank == -1);
    T_OK(ms_fault_find(&p, "exit", 1, 3) && !ms_fault_find(&p, "exit", 2, 3));
    T_OK(ms_fault_find(&p, "kill", 1, 1) && !ms_fault_find(&p, "kill", 1, 0));
    T_OK(ms_fault_find(&p, "stage1:mid", -1, 1) && !ms_fault_find(&p, "stage1:mid", -1, 0));
    /* handed on as fired at step 1: a restart after step 1 does not meet them again */
    char buf[256];
    ms_fault_format(&p, 1, buf, sizeof buf);
    T_STR_EQ(buf, "stage1:mid:1,stage2:after-commit,diag:gemm:2,io:noexchange");
    /* the longest kinds with a rank of several digits: longer than a kind, split first */
    ms_fault_plan q = {.n = 0};
    T_EQ_INT(ms_fault_parse(&q, "stage2:after-shard:10,io:eio-fsync-shard:1000", WHAT), MS_OK);
    T_OK(q.n == 2 && !strcmp(q.f[0].kind, "stage2:after-shard") && q.f[0].rank == 10 &&
         !strcmp(q.f[1].kind, "io:eio-fsync-shard") && q.f[1].rank == 1000);
    /* the manifest's and the commit's points are rank 0's: aimed elsewhere, refused (they
     * never fired, and a chaos run said nothing) */
    ms_fault_plan z = {.n = 0};
    T_EQ_INT(ms_fault_parse(&z, "stage2:after-manifest:0,io:eio-fsync-commit@4", WHAT), MS_OK);
    expect_bad("stage2:after-manifest:10", "'stage2:after-manifest:10'", "rank 0 only");
    expect_bad("stage2:after-commit@30:1", "'stage2:after-commit@30:1'", "rank 0 only");
    expect_bad("io:noexchange:3", "'io:noexchange:3'", "give :0 or no target");
    expect_bad("exit:1:node=b", "'exit:1:node=b'", "one target");
    expect_bad("exit:1@2", "unknown fault 'exit:1'", NULL);
    expect_bad("exit:x", "unknown fault 'exit:x'", NULL);
}

static void test_errors(void) {
    expect_bad("exit@2:node=", "'exit@2:node='", "node name");
    expect_bad("exit@2:node=a/b", "'exit@2:node=a/b'", "[A-Za-z0-9._-]");
    expect_bad("exit@2:node=0123456789012345678901234567890123456789012345678901234567890123",
               "node name", NULL); /* 64 characters: one too many */
    expect_bad("exit@2:1:node=b", "'exit@2:1:node=b'", "one target");
    expect_bad("spike@3", "'spike@3'", "spike needs =X");
    expect_bad("spike=0@3", "'spike=0@3'", "spike needs =X");
    expect_bad("spike=2@3:1", "'spike=2@3:1'", "no rank or node target");
    expect_bad("spike=2@3:node=a", "'spike=2@3:node=a'", "no rank or node target");
    expect_bad("random=1/2/10/4:node=a", "random", "no node target");
    expect_bad("exit@x:node=a", "'exit@x:node=a'",
               "expected KIND[=ARG][@STEP[+]][:RANK | :node=NAME]");
    expect_bad("bogus:node=a", "unknown fault 'bogus'", "spike=X");
    expect_bad("stage2:slow@3+", "'stage2:slow@3+'", "stage2:slow needs =MS");
    expect_bad("bogus", "unknown fault 'bogus'", "stage2:slow=MS");
    /* an argument a sleep cannot take: not a number of milliseconds, or more
     * than the hour a delay may be (usleep's useconds_t wraps at 71 min) */
    expect_bad("stage2:slow=inf@2+", "'stage2:slow=inf@2+'", "=MS");
    expect_bad("slow=inf@2", "'slow=inf@2'", "=MS");
    expect_bad("slow=5000000@2", "'slow=5000000@2'", "3600000");
    expect_bad("stage2:slow=1e10", "'stage2:slow=1e10'", "3600000");
    expect_bad("spike=inf@3", "'spike=inf@3'", "spike needs =X");
    expect_bad("exit=inf@3", "'exit=inf@3'", "expected KIND");
    /* numbers past an int, signs and blanks: refused (sscanf's %d took them,
     * "exit@4294967297" fired at step 1, "kill@3:4294967296" on rank 0) */
    expect_bad("exit@4294967297", "'exit@4294967297'", "expected KIND");
    expect_bad("kill@3:4294967296", "'kill@3:4294967296'", "expected KIND");
    expect_bad("exit@ +7", "'exit@ +7'", "expected KIND");
    expect_bad("exit@-1", "'exit@-1'", "expected KIND");
    expect_bad("kill@3: 1", "'kill@3: 1'", "expected KIND");
    expect_bad("slow= 5@2", "'slow= 5@2'", "expected KIND");
    expect_bad("slow=\n5@2", "expected KIND", NULL);
    expect_bad("random=1/2147483647/10/4", "random=SEED/N/MAXSTEP/WORLD", NULL); /* N+1 wraps */
    expect_bad("random=1/4294967298/10/4", "random=SEED/N/MAXSTEP/WORLD", NULL);
    expect_bad("random=1/2/10/+4", "random=SEED/N/MAXSTEP/WORLD", NULL);
    /* random=... with fewer free steps than faults: refused (it drew for ever) */
    expect_bad("exit@2,random=1/1/2/4", "random=1/1/2/4", "leave 0 of the steps 2..2 free");
    expect_bad("random=1/3/5/2,random=2/3/5/2", "random=2/3/5/2", "leave 1 of the steps 2..5");
    ms_fault_plan p = {.n = 0};
    T_EQ_INT(ms_fault_parse(&p, "exit@2,exit@2,random=1/2/4/4", WHAT), MS_OK); /* 3, 4 free */
    T_EQ_INT(p.n, 4);
    expect_bad("random=1/300/1000/4", "more than 256 faults", NULL);
    ms_fault_plan s = {.n = 0}; /* a 64-bit seed (the time in ns) */
    T_EQ_INT(ms_fault_parse(&s, "random=18446744073709551615/3/50/4", WHAT), MS_OK);
    T_EQ_INT(s.n, 3);
    expect_bad("random=18446744073709551616/3/50/4", "random=SEED", NULL);
}

/* A plan of the most entries, each of the longest form, formats whole and
 * parses back (the driver formats what the trainer parses: a plan above the
 * parser's old 4096 bytes failed every start as a usage error); a buffer
 * too small takes whole entries only and counts the others. */
static void test_format_sizes(void) {
    static ms_fault_plan p, q;
    memset(&p, 0, sizeof p);
    memset(&q, 0, sizeof q);
    T_EQ_INT(ms_fault_parse(&p, "random=7/256/100000/4096", WHAT), MS_OK);
    T_EQ_INT(p.n, 256);
    for (int i = 0; i < p.n; i++) { /* the longest form: a long kind, an argument, a node */
        snprintf(p.f[i].kind, sizeof p.f[i].kind, "stage2:after-manifest");
        p.f[i].arg = 1.2345678901234567;
        p.f[i].step = 2147483000 + i, p.f[i].from = 1, p.f[i].rank = -1;
        memset(p.f[i].node, 'n', MS_NODE_NAME_MAX - 1);
        p.f[i].node[MS_NODE_NAME_MAX - 1] = 0;
    }
    static char buf[MS_FAULT_SPEC_MAX];
    T_EQ_INT(ms_fault_format(&p, 0, buf, sizeof buf), 0);
    T_OK(strlen(buf) > 4096);
    T_EQ_INT(ms_fault_parse(&q, buf, WHAT), MS_OK);
    T_EQ_INT(q.n, 256);
    int same = q.n == p.n;
    for (int i = 0; same && i < p.n; i++)
        same = same_fault(&p.f[i], &q.f[i]);
    T_OK(same);
    ms_fault_plan r = {.n = 0};
    T_EQ_INT(ms_fault_parse(&r, "exit@12,kill@13:1", WHAT), MS_OK);
    char small[12];
    T_EQ_INT(ms_fault_format(&r, 0, small, sizeof small), 1); /* "exit@12" fits, the rest not */
    T_STR_EQ(small, "exit@12");
    T_EQ_INT(ms_fault_format(&r, 0, small, 5), 2); /* not "exit" of "exit@12" */
    T_STR_EQ(small, "");
    char *big = malloc(MS_FAULT_SPEC_MAX + 1);
    memset(big, 'x', MS_FAULT_SPEC_MAX);
    big[MS_FAULT_SPEC_MAX] = 0;
    ms_fault_plan b = {.n = 0};
    T_EQ_INT(ms_fault_parse(&b, big, WHAT), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "more than the 40959 a plan may have");
    free(big);
}

static void test_slow(void) {
    ms_fault_plan p = {.n = 0};
    T_EQ_INT(ms_fault_parse(&p, "slow=40@2", WHAT), MS_OK);
    double t0 = ms_now();
    T_EQ_INT(ms_fault_fire_slow(&p, 1, 0), 0);
    ms_fault_fire_process(&p, 2, 0); /* slow is no longer a process fault */
    double quick = ms_now() - t0;
    t0 = ms_now();
    T_EQ_INT(ms_fault_fire_slow(&p, 2, 0), 1); /* it slept: the trainer records a span */
    double slow = ms_now() - t0;
    T_OK(quick < 0.03);
    T_OK(slow >= 0.039);
}

static void test_node_map(void) {
    char n[MS_NODE_NAME_MAX];
    const char *what = "--node-map";
    T_EQ_INT(ms_node_of("a,b", 1, 2, n, what), MS_OK);
    T_STR_EQ(n, "b");
    static const char *const want[] = {"a", "a", "b", "c"}; /* names[r * 3 / 4] */
    for (int r = 0; r < 4; r++) {
        T_EQ_INT(ms_node_of("a,b,c", r, 4, n, what), MS_OK);
        T_STR_EQ(n, want[r]);
    }
    T_EQ_INT(ms_node_of("node0,node1", 0, 1, n, what), MS_OK); /* a world of one: the first */
    T_STR_EQ(n, "node0");
    T_EQ_INT(ms_node_of(NULL, 0, 1, n, what), MS_OK); /* the host name */
    T_OK(ms_node_name_ok(n));
    T_EQ_INT(ms_node_of("a,,b", 0, 2, n, what), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "--node-map: node name 2 is empty");
    T_EQ_INT(ms_node_of("a,b c", 0, 2, n, what), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "node name 2 'b c'");
    T_EQ_INT(ms_node_of("a,", 0, 2, n, what), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "is empty");
    static char many[MS_NODE_MAP_MAX * 2 + 8];
    size_t len = 0;
    for (int i = 0; i <= MS_NODE_MAP_MAX; i++)
        len += (size_t)snprintf(many + len, sizeof many - len, "%sx", i ? "," : "");
    T_EQ_INT(ms_node_of(many, 0, 2, n, what), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "more than 4096 node names");
    many[len - 2] = 0; /* 4096 names: fine */
    T_EQ_INT(ms_node_of(many, 1, 2, n, what), MS_OK);
    T_STR_EQ(n, "x");
    T_OK(ms_node_name_ok("a.b-c_D9") && !ms_node_name_ok("") && !ms_node_name_ok("a:b"));
}

int main(void) {
    test_no_step();
    test_parse_targets();
    test_find_node();
    test_errors();
    test_format_sizes();
    test_slow();
    test_node_map();
    return ms_test_summary("test_fault");
}
