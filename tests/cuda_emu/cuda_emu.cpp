/* cuda_emu.cpp - the kernel executor: blocks in order, the threads of a
 * block as cooperative ucontext fibers, barriers, warp collectives, the
 * seeded scheduler and the deadlock check (the model is described in
 * cuda_emu.h).
 *
 * Launches are serialised by one mutex, so the executor state below is
 * process-global and the built-ins are plain globals that the scheduler
 * sets before it resumes a fiber.  Fiber stacks are mapped lazily, once,
 * and kept for the life of the process.
 *
 * Scheduling.  There is no scheduler loop: a fiber that reaches a sync
 * point updates its warp's (or the block's) arrival counts, releases the
 * warp or block if it was the last to arrive, then picks the next fiber
 * itself (pick) and switches to it directly; the launching thread gets the
 * CPU back only when no fiber can run (the block is done, or deadlocked).
 * Warps have priorities, redrawn at every block barrier: the highest warp
 * with runnable lanes runs (its lanes in random order), so it runs ahead
 * to the next __syncthreads before the others start, unless a random
 * "change point" sends it to a random lower rank first, which interleaves
 * warps more finely (the probability per pick is drawn for each block from
 * 0, 2^-10, 2^-7, 2^-4, 2^-2).  One RNG draw per pick, O(1) work per sync point plus O(warps)
 * per change of warp and O(threads) per block barrier.
 *
 * Context switches: ucontext (makecontext / swapcontext) everywhere; on
 * x86-64 a switch of the callee-saved registers is used instead by default,
 * because glibc's swapcontext makes a sigprocmask system call every time
 * (~3x slower per sync point).  MS_EMU_UCONTEXT=1 forces ucontext.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "cuda_emu.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

#if defined(__x86_64__)
#define MSEMU_FAST_SWITCH 1
/* Saves rbp, rbx, r12-r15, MXCSR and the x87 control word on the current
 * stack, stores the stack pointer in *save_sp, and resumes to_sp's. */
extern "C" void msemu_ctx_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl msemu_ctx_switch\n"
    ".type msemu_ctx_switch,@function\n"
    "msemu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size msemu_ctx_switch, .-msemu_ctx_switch\n");
#endif

namespace msemu {
namespace {

enum fstate { F_RUN, F_BLOCK, F_WARP, F_COLL, F_DONE };

struct Ctx {
    ucontext_t uc;
    void *sp;      /* the fast switch's saved stack pointer */
    bool uc_ready; /* getcontext done */
};

struct Fiber {
    Ctx ctx;
    char *stack; /* mapping, the guard region first */
    uint3 tid;
    int state;
    const char *what; /* the sync call it waits in */
    int op, arg, pred;
    uint64_t bits, result;
};

/* A warp of the running block: its runnable lanes and who waits where. */
struct Warp {
    int run[32];             /* runnable fiber ids, in no order */
    int nrun;                /* how many */
    int lanes;               /* 32, fewer in a partial last warp */
    int nwarp, ncoll, ndone; /* lanes at __syncwarp/wmma, at a collective, exited */
};

struct Exec {
    std::mutex lock;
    Fiber *f = nullptr;                /* 1024 */
    Warp *w = nullptr;                 /* 32 */
    size_t stack_bytes = 0, guard = 0; /* mapping size incl. the guard */
    int n = 0, cur = -1, live = 0;
    int nw = 0, nblock = 0; /* warps in the block; fibers at __syncthreads */
    int order[32];          /* warp ids by priority, highest first */
    int top = -1;           /* the warp being run; -1: choose by order */
    uint32_t change = 0;    /* P(a change point at a pick) * 2^32, per block */
    Ctx main;
    bool fast = false; /* this launch uses msemu_ctx_switch */
    body_fn fn = nullptr;
    const void *arg = nullptr;
    const char *name = nullptr;           /* of the running kernel, if the launch named it */
    std::map<const void *, size_t> optin; /* kernel -> MaxDynamicSharedMemorySize */
    size_t optin_max = 0;                 /* the largest of them */
    unsigned char *smem = nullptr;
    size_t smem_cap = 0, smem_bytes = 0;
    uint64_t rng = 0;
    bool in_kernel = false;
};
Exec X;

uint64_t rng_next() {
    uint64_t z = (X.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "msemu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

const size_t GUARD = 64 * 1024;

/* A fault in a guard region is a kernel thread that ran out of stack: say so
 * (once), then let the default action kill the process. */
void segv_handler(int sig, siginfo_t *si, void *ctx) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; X.f && i < 1024; i++) {
        uintptr_t s = (uintptr_t)X.f[i].stack;
        if (s && a >= s && a < s + GUARD) {
            static const char msg[] = "msemu: a kernel thread overflowed its fiber stack "
                                      "(raise MS_EMU_STACK_KB, default 256)\n";
            if (write(2, msg, sizeof msg - 1) < 0) break;
            break;
        }
    }
    signal(SIGSEGV, SIG_DFL); /* the faulting access repeats and kills */
}

void install_segv_handler() {
    struct sigaction old;
    if (sigaction(SIGSEGV, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
    static char alt[64 * 1024];
    stack_t ss = {};
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    if (sigaltstack(&ss, nullptr) != 0) return;
    struct sigaction sa = {};
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
}

const char *kname() {
    return X.name ? X.name : "(unnamed: MS_LAUNCH)";
}

/* A broken rule of the dialect found by the scheduler: names the kernel and
 * the block, then aborts. */
void die_in_block(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void die_in_block(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "msemu: kernel %s, block (%u,%u,%u): ", kname(), blockIdx.x, blockIdx.y,
            blockIdx.z);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

void init_once() {
    if (X.f) return;
    X.f = (Fiber *)calloc(1024, sizeof(Fiber));
    X.w = (Warp *)calloc(32, sizeof(Warp));
    if (!X.f || !X.w) die("out of memory for the fiber table");
    size_t page = (size_t)sysconf(_SC_PAGESIZE), kb = 256;
    const char *e = getenv("MS_EMU_STACK_KB");
    if (e && atol(e) >= 64) kb = (size_t)atol(e);
    X.stack_bytes = (kb * 1024 + page - 1) / page * page + GUARD;
    const char *s = getenv("MS_EMU_SEED");
    X.rng = s ? strtoull(s, nullptr, 0) : 0x5eedull;
    install_segv_handler();
}

char *stack_of(int i) {
    Fiber *f = &X.f[i];
    if (!f->stack) {
        void *p = mmap(nullptr, X.stack_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED) die("cannot map a fiber stack: %s", strerror(errno));
        mprotect(p, GUARD, PROT_NONE); /* an overflow faults instead of corrupting */
        f->stack = (char *)p;
    }
    return f->stack;
}

void fiber_entry();

/* Apart, since getcontext returns twice (-Wclobbered in its caller). */
__attribute__((noinline)) void uc_init(Ctx *c) {
    getcontext(&c->uc);
    c->uc_ready = true;
}

/* Make fiber i start at fiber_entry on its own stack. */
void ctx_start(int i) {
    Fiber *f = &X.f[i];
    char *stack = stack_of(i);
#ifdef MSEMU_FAST_SWITCH
    if (X.fast) {
        uint64_t *sp = (uint64_t *)(((uintptr_t)stack + X.stack_bytes) & ~(uintptr_t)15);
        uint32_t mxcsr;
        uint16_t fpcw;
        asm volatile("stmxcsr %0" : "=m"(mxcsr));
        asm volatile("fnstcw %0" : "=m"(fpcw));
        *--sp = 0;                      /* fiber_entry's return address: never used */
        *--sp = (uint64_t)&fiber_entry; /* where msemu_ctx_switch returns to */
        for (int r = 0; r < 6; r++)
            *--sp = 0;
        *--sp = (uint64_t)mxcsr | (uint64_t)fpcw << 32;
        f->ctx.sp = sp;
        return;
    }
#endif
    if (!f->ctx.uc_ready) uc_init(&f->ctx);
    f->ctx.uc.uc_stack.ss_sp = stack + GUARD;
    f->ctx.uc.uc_stack.ss_size = X.stack_bytes - GUARD;
    f->ctx.uc.uc_link = nullptr;
    makecontext(&f->ctx.uc, fiber_entry, 0);
}

/* Save the running context in *save (NULL: it is never resumed), resume *to. */
void ctx_switch(Ctx *save, Ctx *to) {
#ifdef MSEMU_FAST_SWITCH
    if (X.fast) {
        void *dead;
        msemu_ctx_switch(save ? &save->sp : &dead, to->sp);
        return;
    }
#endif
    if (save)
        swapcontext(&save->uc, &to->uc);
    else
        setcontext(&to->uc);
}

/* Uniform in [0, k) from 32 random bits. */
inline int below(uint32_t r, int k) {
    return (int)(((uint64_t)r * (uint64_t)k) >> 32);
}

/* New warp priorities (a random order) and a new choice of warp. */
void draw_priorities() {
    for (int i = 0; i < X.nw; i++)
        X.order[i] = i;
    for (int i = X.nw - 1; i > 0; i--) {
        int j = below((uint32_t)rng_next(), i + 1), t = X.order[i];
        X.order[i] = X.order[j];
        X.order[j] = t;
    }
    X.top = -1;
}

/* A change point: warp w moves to a random rank below its own. */
void demote(int w) {
    int r = 0;
    while (X.order[r] != w)
        r++;
    if (r == X.nw - 1) return;
    int to = r + 1 + below((uint32_t)rng_next(), X.nw - 1 - r);
    for (int i = r; i < to; i++)
        X.order[i] = X.order[i + 1];
    X.order[to] = w;
}

/* The next fiber to run, taken off its warp's runnable set; -1 if none. */
int pick() {
    uint64_t r = rng_next();
    if (X.top >= 0 && X.w[X.top].nrun && (uint32_t)(r >> 32) < X.change) {
        demote(X.top);
        X.top = -1;
    }
    if (X.top < 0 || !X.w[X.top].nrun) {
        X.top = -1;
        for (int i = 0; i < X.nw && X.top < 0; i++)
            if (X.w[X.order[i]].nrun) X.top = X.order[i];
        if (X.top < 0) return -1;
    }
    Warp *W = &X.w[X.top];
    int i = below((uint32_t)r, W->nrun), id = W->run[i];
    W->run[i] = W->run[--W->nrun];
    return id;
}

/* Hand the CPU to the next runnable fiber, or to the launching thread when
 * there is none; `save` is where the caller resumes (NULL: it never does).
 * The resumer sets X.cur and threadIdx before it switches. */
void switch_next(Ctx *save) {
    int me = X.cur, id = pick();
    if (id >= 0 && id == me) return; /* released and picked again: no switch */
    Ctx *to = &X.main;
    X.cur = id;
    if (id >= 0) {
        threadIdx = X.f[id].tid;
        to = &X.f[id].ctx;
    }
    ctx_switch(save, to);
}

void release_warp(int w);
void release_block();

void fiber_entry() {
    X.fn(X.arg);
    int id = X.cur;
    Warp *W = &X.w[id >> 5];
    X.f[id].state = F_DONE;
    X.live--;
    W->ndone++;
    /* an exited lane no longer holds back __syncwarp, nor an exited thread
     * __syncthreads (sm_70+) */
    if (W->nwarp + W->ncoll && W->nwarp + W->ncoll + W->ndone == W->lanes) release_warp(id >> 5);
    if (X.nblock && X.nblock == X.live) release_block();
    switch_next(nullptr);
    die("an exited fiber was resumed");
}

/* Wait at a sync point: count the arrival, release the warp or the block
 * if this fiber completes it, and give the CPU away until released. */
Fiber *suspend(int state, const char *what) {
    if (!X.in_kernel || X.cur < 0) die("%s called outside a kernel", what);
    int id = X.cur;
    Fiber *f = &X.f[id];
    f->state = state;
    f->what = what;
    if (state == F_BLOCK) {
        if (++X.nblock == X.live) release_block();
    } else {
        Warp *W = &X.w[id >> 5];
        if (state == F_WARP)
            W->nwarp++;
        else
            W->ncoll++;
        if (W->nwarp + W->ncoll + W->ndone == W->lanes) release_warp(id >> 5);
    }
    switch_next(&f->ctx);
    return f;
}

void dump_and_die(const char *why) {
    fprintf(stderr, "msemu: deadlock/divergent barrier in kernel %s: %s\n", kname(), why);
    fprintf(stderr, "msemu: block (%u,%u,%u) of grid (%u,%u,%u), block dim (%u,%u,%u):\n",
            blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
            blockDim.y, blockDim.z);
    for (int w = 0; w * 32 < X.n; w++) {
        int cnt[5] = {0, 0, 0, 0, 0};
        const char *what[5] = {"", "", "", "", ""};
        for (int l = w * 32; l < X.n && l < w * 32 + 32; l++) {
            cnt[X.f[l].state]++;
            what[X.f[l].state] = X.f[l].what;
        }
        fprintf(stderr, "msemu:   warp %d:", w);
        for (int s = 1; s < 5; s++) {
            if (!cnt[s]) continue;
            if (s == F_DONE)
                fprintf(stderr, " %d exited", cnt[s]);
            else
                fprintf(stderr, " %d at %s", cnt[s], what[s]);
        }
        fprintf(stderr, "\n");
    }
    fflush(stderr);
    abort();
}

/* Results of a warp whose 32 lanes all wait at a collective. */
void finish_collective(int w) {
    Fiber *l0 = &X.f[w * 32];
    for (int l = 0; l < 32; l++) {
        Fiber *f = &l0[l];
        if (f->op != l0->op)
            die_in_block("divergent warp collectives in warp %d: lane %d is in %s, lane 0 in %s", w,
                         l, f->what, l0->what);
        if (f->op == WC_BALLOT) {
            uint64_t b = 0;
            for (int k = 0; k < 32; k++)
                b |= (uint64_t)(l0[k].bits != 0) << k;
            f->result = b;
            continue;
        }
        int src = l;
        if (f->op == WC_XOR) src = l ^ f->arg;
        if (f->op == WC_DOWN) src = l + f->arg;
        if (f->op == WC_UP) src = l - f->arg;
        if (f->op == WC_IDX) src = f->arg & 31;
        if (src < 0 || src > 31) src = l; /* out of range: the lane keeps its value */
        f->result = l0[src].bits;
    }
}

/* Every live lane of warp w waits at a warp sync point: check the
 * collective rules (see cuda_emu.h), compute its results, make the lanes
 * runnable. */
void release_warp(int w) {
    Warp *W = &X.w[w];
    int lo = w * 32, hi = lo + W->lanes;
    if (W->ncoll) {
        Fiber *c = &X.f[lo];
        while (c->state != F_COLL)
            c++;
        if (W->lanes < 32)
            die_in_block("%s in warp %d of a block of %d threads: a partial warp (lanes %d..31 do "
                         "not exist) cannot shuffle with the full mask",
                         c->what, w, X.n, W->lanes);
        if (W->ndone)
            die_in_block("%s in warp %d while %d of its lanes have exited", c->what, w, W->ndone);
        if (W->nwarp)
            die_in_block("warp %d: %d lanes wait at %s and %d at a warp sync (divergent)", w,
                         W->ncoll, c->what, W->nwarp);
        finish_collective(w);
    }
    for (int l = lo; l < hi; l++)
        if (X.f[l].state != F_DONE) {
            X.f[l].state = F_RUN;
            W->run[W->nrun++] = l;
        }
    W->nwarp = W->ncoll = 0;
}

/* Every live thread waits at __syncthreads*: compute the predicate, make
 * them runnable, redraw the warp priorities. */
void release_block() {
    int sum = 0, all = 1, any = 0;
    for (int i = 0; i < X.n; i++)
        if (X.f[i].state == F_BLOCK) {
            sum += X.f[i].pred != 0;
            all &= X.f[i].pred != 0;
            any |= X.f[i].pred != 0;
        }
    for (int i = 0; i < X.n; i++)
        if (X.f[i].state == F_BLOCK) {
            Fiber *f = &X.f[i];
            Warp *W = &X.w[i >> 5];
            f->result = f->op == PRED_COUNT ? sum : f->op == PRED_AND ? all : any;
            f->state = F_RUN;
            W->run[W->nrun++] = i;
        }
    X.nblock = 0;
    draw_priorities();
}

void run_block(dim3 b) {
    /* change-point probabilities per pick, one drawn per block: none (each
     * warp runs to its next __syncthreads), rare, ..., frequent */
    static const uint32_t change[] = {0, 1u << 22, 1u << 25, 1u << 28, 1u << 30};
    X.n = (int)(b.x * b.y * b.z);
    X.nw = (X.n + 31) / 32;
    for (int w = 0; w < X.nw; w++) {
        Warp *W = &X.w[w];
        W->lanes = X.n - w * 32 < 32 ? X.n - w * 32 : 32;
        W->nrun = W->nwarp = W->ncoll = W->ndone = 0;
    }
    for (int i = 0; i < X.n; i++) {
        Fiber *f = &X.f[i];
        f->tid = uint3{i % b.x, (i / b.x) % b.y, i / (b.x * b.y)};
        f->state = F_RUN;
        f->what = "";
        ctx_start(i);
        X.w[i >> 5].run[X.w[i >> 5].nrun++] = i;
    }
    if (X.smem) memset(X.smem, 0xA5, X.smem_bytes);
    X.live = X.n;
    X.nblock = 0;
    X.change = change[below((uint32_t)rng_next(), 5)];
    draw_priorities();
    X.cur = -1;
    switch_next(&X.main); /* back when no fiber can run */
    if (X.live) dump_and_die("no barrier can be released");
}

/* NULL if the configuration can launch, else why not (in why). */
const char *check_config(const void *kernel, dim3 g, dim3 b, size_t smem, char *why, size_t n) {
    unsigned long long nt = (unsigned long long)b.x * b.y * b.z;
    size_t lim = X.optin_max;
    if (kernel) lim = X.optin.count(kernel) ? X.optin[kernel] : 0;
    if (!nt || !g.x || !g.y || !g.z)
        snprintf(why, n, "empty grid (%u,%u,%u) or block (%u,%u,%u)", g.x, g.y, g.z, b.x, b.y, b.z);
    else if (nt > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
        snprintf(why, n, "block (%u,%u,%u) has %llu threads (at most 1024, z <= 64)", b.x, b.y, b.z,
                 nt);
    else if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
        snprintf(why, n, "grid (%u,%u,%u) over the limits (2^31-1, 65535, 65535)", g.x, g.y, g.z);
    else if (smem > MSEMU_SMEM_OPTIN)
        snprintf(why, n, "%zu bytes of dynamic shared memory (the device has %d)", smem,
                 MSEMU_SMEM_OPTIN);
    else if (smem > MSEMU_SMEM_DEFAULT && smem > lim)
        snprintf(why, n,
                 "%zu bytes of dynamic shared memory, over 48 KiB and over what "
                 "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) set for %s "
                 "(%zu)",
                 smem, kernel ? "this kernel" : "any kernel", lim);
    else
        return nullptr;
    return why;
}

} // namespace

[[noreturn]] void kernel_fault(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "msemu: kernel fault in %s, block (%u,%u,%u) thread (%u,%u,%u): ", kname(),
            blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

cudaError_t func_set_attribute(const void *entry, enum cudaFuncAttribute attr, int value) {
    if (!entry) {
        set_last_error(cudaErrorInvalidDeviceFunction);
        return cudaErrorInvalidDeviceFunction;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > MSEMU_SMEM_OPTIN) {
        set_last_error(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    std::lock_guard<std::mutex> g(X.lock);
    X.optin[entry] = (size_t)value;
    if ((size_t)value > X.optin_max) X.optin_max = (size_t)value;
    return cudaSuccess;
}

void launch_impl(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem,
                 cudaStream_t stream, body_fn fn, const void *arg) {
    static thread_local bool launching;
    if (launching) die("kernel launch from inside a kernel");
    std::lock_guard<std::mutex> g(X.lock);
    char why[200];
    if (check_config(kernel, grid, block, smem, why, sizeof why)) {
        fprintf(stderr, "msemu: launch of %s refused: %s\n", name ? name : "a kernel", why);
        set_last_error(smem > MSEMU_SMEM_DEFAULT ? cudaErrorInvalidValue
                                                 : cudaErrorInvalidConfiguration);
        return;
    }
    if (!stream_ok(stream)) {
        fprintf(stderr, "msemu: launch of %s refused: stream %p was not created (or destroyed)\n",
                name ? name : "a kernel", (void *)stream);
        set_last_error(cudaErrorInvalidResourceHandle);
        return;
    }
    init_once();
    if (smem > X.smem_cap) {
        free(X.smem);
        X.smem = (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128);
        if (!X.smem) die("out of memory for %zu bytes of shared memory", smem);
        X.smem_cap = smem;
    }
    X.smem_bytes = smem;
    const char *uc = getenv("MS_EMU_UCONTEXT");
#ifdef MSEMU_FAST_SWITCH
    X.fast = !(uc && *uc && strcmp(uc, "0") != 0);
#else
    (void)uc;
#endif
    X.fn = fn;
    X.arg = arg;
    X.name = name;
    X.in_kernel = launching = true;
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = uint3{x, y, z};
                run_block(block);
            }
    X.in_kernel = launching = false;
    X.fn = nullptr;
    X.name = nullptr;
}

uint64_t reseed(uint64_t seed) {
    std::lock_guard<std::mutex> g(X.lock);
    init_once();
    uint64_t old = X.rng;
    X.rng = seed;
    return old;
}

void *dyn_smem() {
    if (!X.in_kernel) die("MS_DYN_SMEM outside a kernel");
    return X.smem_bytes ? X.smem : nullptr;
}

int block_sync(int pred_op, int pred) {
    if (!X.in_kernel || X.cur < 0) die("__syncthreads called outside a kernel");
    Fiber *f = &X.f[X.cur];
    f->op = pred_op;
    f->pred = pred;
    f = suspend(F_BLOCK, pred_op == PRED_NONE ? "__syncthreads" : "__syncthreads_<pred>");
    return (int)f->result;
}

void warp_sync(unsigned mask, const char *what) {
    if (mask != 0xffffffffu)
        kernel_fault("%s(0x%08x): the emulator supports only the full mask", what, mask);
    suspend(F_WARP, what);
}

uint64_t warp_collective(int op, unsigned mask, uint64_t bits, int arg, int width,
                         const char *what) {
    if (mask != 0xffffffffu)
        kernel_fault("%s(mask 0x%08x): the emulator supports only the full mask", what, mask);
    if (width != 32) kernel_fault("%s(width %d): the emulator supports only width 32", what, width);
    if (!X.in_kernel || X.cur < 0) die("%s called outside a kernel", what);
    Fiber *f = &X.f[X.cur];
    f->op = op;
    f->arg = arg;
    f->bits = bits;
    f = suspend(F_COLL, what);
    return f->result;
}

} // namespace msemu
