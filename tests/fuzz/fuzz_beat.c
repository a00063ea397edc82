/* fuzz_beat.c - libFuzzer harness of the supervisor's wire parsers: the
 * heartbeat line (src/supervisor/sup_beat.c, sup_beat_parse) and the control
 * line (src/supervisor/sup_ctl.c, sup_ctl_parse), both reached by anyone
 * who can connect to the driver's port.
 *
 * The input is a stream of lines; each goes to both parsers, with the
 * job's token and a world of 8 ranks as the driver would pass them.  A
 * parser must reject a line (-1, with a reason) or accept it; never crash,
 * leak or read past the line.  What it accepts is in range: the rank in
 * the world, the strings terminated inside their fields, a known phase
 * and command.
 */
#include <string.h>

#include "fuzz_lines.h"
#include "monitor/heartbeat.h"
#include "supervisor/sup.h"

#define TOKEN "0123456789abcdef0123456789abcdef"
#define WORLD 8

#define TERMINATED(field) (memchr((field), 0, sizeof(field)) != NULL)

static void check_beat(const char *line, size_t len) {
    sup_beat b;
    const char *why = NULL;
    if (sup_beat_parse(line, len, TOKEN, WORLD, &b, &why) != 0) {
        MS_CHECK(why && *why);
        return;
    }
    MS_CHECK(b.rank >= 0 && b.rank < WORLD && b.world == WORLD && b.pid >= 1 && b.step >= 0);
    MS_CHECK(TERMINATED(b.host) && TERMINATED(b.node) && TERMINATED(b.phase));
    MS_CHECK(TERMINATED(b.error) && TERMINATED(b.ckpt_error));
    MS_CHECK(b.redone >= 0 && b.ckpt_commit >= -1 && b.ckpt_failed >= 0);
}

static void check_ctl(const char *line, size_t len) {
    sup_ctl_msg m;
    const char *why = NULL;
    if (sup_ctl_parse(line, len, TOKEN, &m, &why) != 0) {
        MS_CHECK(why && *why);
        return;
    }
    MS_CHECK(len <= SUP_CTL_LINE_MAX && TERMINATED(m.cmd) && TERMINATED(m.node));
    MS_CHECK(!strcmp(m.cmd, "status") ? !m.node[0] : !strcmp(m.cmd, "evict") && m.node[0]);
}

static void on_line(void *arg, const char *line, size_t len) {
    if (len < MON_HB_LINE_MAX) check_beat(line, len); /* the driver drops longer lines */
    check_ctl(line, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_each_line(data, size, on_line, NULL);
    return 0;
}
