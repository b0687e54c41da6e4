/*
 * Metadata micro-benchmark for bench/fuse/run.sh: create (open O_CREAT|O_EXCL,
 * write 100 bytes, close), stat, then unlink N small files in one directory.
 * Prints one line per phase, "<phase> <ops per second>", then one more per phase,
 * "<phase>-p50-us <µs>": the median time of one operation. On a shared machine the
 * rate moves with every preemption of this process or of the daemon; the median of
 * the single operations is what a typical one costs.
 *
 * metabench DIR COUNT -t [PID] also prints, for the profile pass of run.sh:
 *   phases <s0> <e0> <s1> <e1> <s2> <e2>
 *                   CLOCK_MONOTONIC seconds at which each phase began and ended (the
 *                   kernel's "mono" trace clock), to split a trace of FUSE requests;
 *   client_cpu <c0> <c1> <c2> <c3>
 *                   this process's CPU time (user + system, seconds) before the first
 *                   phase and after each;
 *   daemon_cpu <d0> <d1> <d2> <d3>
 *                   with PID: the same for every thread of process PID (the FUSE
 *                   daemon), from /proc/PID/task/TID/schedstat.
 *
 * Written in C so the timing measures the filesystem, not an interpreter.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double clock_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now(void) { return clock_s(CLOCK_MONOTONIC); }

/* CPU seconds run by all threads of `pid` (0: none asked for). */
static double daemon_cpu(long pid) {
    char path[320], line[128];
    double total = 0;
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%ld/task", pid);
    DIR *tasks = opendir(path);
    if (!tasks) return 0;
    struct dirent *e;
    while ((e = readdir(tasks)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/%ld/task/%s/schedstat", pid, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(line, sizeof line, f)) total += strtod(line, NULL) / 1e9;
        fclose(f);
    }
    closedir(tasks);
    return total;
}

/* One phase boundary: wall clock, own CPU, the daemon's CPU. */
struct mark {
    double t, client, daemon;
};

static struct mark mark(long pid, int profile) {
    struct mark m = {now(), 0, 0};
    if (profile) {
        m.client = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        m.daemon = daemon_cpu(pid);
        /* Reading /proc is not the next phase's work. */
        m.t = now();
    }
    return m;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of `v[0..n)`, in µs (sorts `v`). */
static double p50_us(double *v, long n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n ? v[n / 2] * 1e6 : 0;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "metabench: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

int main(int argc, char **argv) {
    int profile = argc >= 4 && strcmp(argv[3], "-t") == 0;
    if (!(argc == 3 || (profile && argc <= 5))) {
        fprintf(stderr, "usage: metabench DIR COUNT [-t [PID]]\n");
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    long pid = argc == 5 ? atol(argv[4]) : 0;
    char path[4096], data[100];
    memset(data, 'x', sizeof data);
    struct stat st;
    struct mark m[4];

    double *lat[3];
    for (int p = 0; p < 3; p++)
        if (!(lat[p] = malloc((n ? n : 1) * sizeof(double)))) die("malloc", "");

    m[0] = mark(pid, profile);
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%07ld", dir, i);
        double t = now();
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) die("create", path);
        if (write(fd, data, sizeof data) != (ssize_t)sizeof data) die("write", path);
        if (close(fd) != 0) die("close", path);
        lat[0][i] = now() - t;
    }
    double end0 = now();
    m[1] = mark(pid, profile);
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%07ld", dir, i);
        double t = now();
        if (stat(path, &st) != 0 || st.st_size != sizeof data) die("stat", path);
        lat[1][i] = now() - t;
    }
    double end1 = now();
    m[2] = mark(pid, profile);
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%07ld", dir, i);
        double t = now();
        if (unlink(path) != 0) die("unlink", path);
        lat[2][i] = now() - t;
    }
    double end2 = now();
    m[3] = mark(pid, profile);
    printf("create %.0f\nstat %.0f\nunlink %.0f\n", n / (end0 - m[0].t), n / (end1 - m[1].t),
           n / (end2 - m[2].t));
    printf("create-p50-us %.2f\nstat-p50-us %.2f\nunlink-p50-us %.2f\n", p50_us(lat[0], n),
           p50_us(lat[1], n), p50_us(lat[2], n));
    if (profile) {
        printf("phases %.9f %.9f %.9f %.9f %.9f %.9f\n", m[0].t, end0, m[1].t, end1, m[2].t, end2);
        printf("client_cpu %.9f %.9f %.9f %.9f\n", m[0].client, m[1].client, m[2].client, m[3].client);
        if (pid > 0)
            printf("daemon_cpu %.9f %.9f %.9f %.9f\n", m[0].daemon, m[1].daemon, m[2].daemon,
                   m[3].daemon);
    }
    return 0;
}
