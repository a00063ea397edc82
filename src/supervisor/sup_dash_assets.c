/* sup_dash_assets.c - the dashboard's pages, built into the binary: the
 * files of web/dashboard/ and Chart.js (Debian's libjs-chart.js), included
 * byte for byte by the assembler (.incbin) from the paths CMake passes
 * (MS_WEB_DIR, MS_CHARTJS).  The server answers only these paths: nothing
 * of a request ever reaches the file system. */
#include <pthread.h>
#include <string.h>

#include "supervisor/sup_dash_internal.h"

#ifndef MS_WEB_DIR
#error "MS_WEB_DIR (web/dashboard) must be defined by the build"
#endif
#ifndef MS_CHARTJS
#error "MS_CHARTJS (Chart.js, Debian's libjs-chart.js) must be defined by the build"
#endif

/* sym[] .. sym_end[]: the file's bytes, in .rodata. */
#define DASH_INCBIN(sym, file)                                                                     \
    __asm__(".section .rodata\n"                                                                   \
            ".global " #sym "\n.hidden " #sym "\n.balign 16\n" #sym ":\n"                          \
            ".incbin \"" file "\"\n"                                                               \
            ".global " #sym "_end\n.hidden " #sym "_end\n" #sym "_end:\n"                          \
            ".byte 0\n"                                                                            \
            ".previous\n");                                                                        \
    extern const unsigned char sym[], sym##_end[]

DASH_INCBIN(ms_dash_index, MS_WEB_DIR "/index.html");
DASH_INCBIN(ms_dash_js, MS_WEB_DIR "/dash.js");
DASH_INCBIN(ms_dash_css, MS_WEB_DIR "/dash.css");
DASH_INCBIN(ms_dash_chart, MS_CHARTJS);

static dash_asset assets[5];
static const char *const paths[5] = {"/", "/index.html", "/static/dash.js", "/static/dash.css",
                                     "/static/chart.js"};
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void fill(void) {
    const unsigned char *b[4] = {ms_dash_index, ms_dash_js, ms_dash_css, ms_dash_chart};
    const unsigned char *e[4] = {ms_dash_index_end, ms_dash_js_end, ms_dash_css_end,
                                 ms_dash_chart_end};
    static const char *const types[4] = {
        "text/html; charset=utf-8", "text/javascript; charset=utf-8", "text/css; charset=utf-8",
        "text/javascript; charset=utf-8"};
    for (int i = 0; i < 5; i++) {
        int k = i == 0 ? 0 : i - 1;
        assets[i] = (dash_asset){paths[i], types[k], b[k], (size_t)(e[k] - b[k]), k == 0};
    }
}

const dash_asset *dash_asset_find(const char *path) {
    pthread_once(&once, fill);
    for (int i = 0; i < 5; i++)
        if (!strcmp(path, paths[i])) return &assets[i];
    return NULL;
}
