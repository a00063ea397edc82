/* test_shm_sweep.c - base/shm_sweep.c: in a temporary directory, files of a
 * prefix that no process uses are found and removed; a file a live child
 * maps (its descriptor closed), one it only holds open, files of another
 * prefix, directories, links and files too young stay.  mpirun's session
 * directory goes, a link in its place does not. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/shm_sweep.h"
#include "check.h"
#include "tmpdir.h"

static int exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static void make_file(const char *p, size_t size) {
    int fd = open(p, O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)size) != 0) perror("ftruncate");
        close(fd);
    }
}

/* A child that maps path (map 1, then closes the descriptor) or holds it
 * open (map 0) until killed; returns once it has. */
static pid_t holder(const char *path, int map) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        int fd = open(path, O_RDWR);
        if (fd < 0) _exit(1);
        if (map) {
            void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED) _exit(1);
            close(fd);
        }
        if (write(p[1], "r", 1) != 1) _exit(1);
        for (;;)
            pause();
    }
    close(p[1]);
    char c;
    if (read(p[0], &c, 1) != 1) pid = -1;
    close(p[0]);
    return pid;
}

static void end(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

static void test_sweep(void) {
    make_file(tpath("seg.orphan"), 8192);
    make_file(tpath("seg.mapped"), 4096);
    make_file(tpath("seg.held"), 4096);
    make_file(tpath("other.orphan"), 4096);
    mkdir(tpath("seg.dir"), 0700);
    if (symlink(tpath("other.orphan"), tpath("seg.link")) != 0) perror("symlink");
    pid_t a = holder(tpath("seg.mapped"), 1), b = holder(tpath("seg.held"), 0);
    T_OK(a > 0 && b > 0);
    ms_sweep_result r;

    /* too young for a minute's min age: nothing considered */
    T_OK(ms_sweep_unused(tmpdir, "seg.", 60.0, 1, &r) == MS_OK);
    T_EQ_INT(r.found, 0);
    T_OK(exists(tpath("seg.orphan")));

    /* a dry run counts, removes nothing */
    T_OK(ms_sweep_unused(tmpdir, "seg.", 0.0, 0, &r) == MS_OK);
    T_EQ_INT(r.found, 3);
    T_EQ_INT(r.in_use, 2);
    T_EQ_INT(r.removed, 1);
    T_EQ_INT(r.bytes, 8192);
    T_OK(exists(tpath("seg.orphan")));

    T_OK(ms_sweep_unused(tmpdir, "seg.", 0.0, 1, &r) == MS_OK);
    T_EQ_INT(r.removed, 1);
    T_OK(!exists(tpath("seg.orphan")));
    T_OK(exists(tpath("seg.mapped")) && exists(tpath("seg.held")));
    T_OK(exists(tpath("other.orphan")) && exists(tpath("seg.dir")) && exists(tpath("seg.link")));

    /* the holders gone, their files go */
    end(a), end(b);
    T_OK(ms_sweep_unused(tmpdir, "seg.", 0.0, 1, &r) == MS_OK);
    T_EQ_INT(r.found, 2);
    T_EQ_INT(r.removed, 2);
    T_EQ_INT(r.in_use, 0);
    T_OK(!exists(tpath("seg.mapped")) && !exists(tpath("seg.held")));
    T_OK(exists(tpath("other.orphan")) && exists(tpath("seg.dir")) && exists(tpath("seg.link")));

    /* a directory that is not there: nothing, no error */
    T_OK(ms_sweep_unused(tpath("no-such-dir"), "seg.", 0.0, 1, &r) == MS_OK);
    T_EQ_INT(r.found, 0);
}

static void test_session_dir(void) {
    char host[256] = {0}, top[600], dir[700], deep[800];
    gethostname(host, sizeof host - 1);
    host[strcspn(host, ".")] = 0;
    snprintf(top, sizeof top, "%s/ompi.%s.%lu", tmpdir, host, (unsigned long)geteuid());
    snprintf(dir, sizeof dir, "%s/pid.4242", top);
    mkdir(top, 0700), mkdir(dir, 0700);
    snprintf(deep, sizeof deep, "%s/0", dir);
    mkdir(deep, 0700);
    snprintf(deep, sizeof deep, "%s/0/contact.txt", dir);
    make_file(deep, 100);
    T_EQ_INT(ms_sweep_mpirun_session(tmpdir, 4243), 0); /* another mpirun's */
    T_OK(exists(dir));
    T_EQ_INT(ms_sweep_mpirun_session(tmpdir, 4242), 1);
    T_OK(!exists(dir) && exists(top));
    T_EQ_INT(ms_sweep_mpirun_session(tmpdir, 4242), 0);

    /* a link where the directory would be: left, and its target too */
    mkdir(tpath("keep"), 0700);
    make_file(tpath("keep/f"), 10);
    snprintf(dir, sizeof dir, "%s/pid.4244", top);
    if (symlink(tpath("keep"), dir) != 0) perror("symlink");
    T_EQ_INT(ms_sweep_mpirun_session(tmpdir, 4244), 0);
    T_OK(exists(dir) && exists(tpath("keep/f")));
}

int main(void) {
    if (!ms_tmpdir_make("shm_sweep")) return 1;
    test_sweep();
    test_session_dir();
    ms_tmpdir_remove();
    return ms_test_summary("test_shm_sweep");
}
