/*
 * Metadata micro-benchmark for bench/fuse/run.sh: create (open O_CREAT|O_EXCL,
 * write 100 bytes, close), stat, then unlink N small files in one directory.
 * Prints one line per phase: "<phase> <ops per second>".
 *
 * Written in C so the timing measures the filesystem, not an interpreter.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "metabench: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: metabench DIR COUNT\n");
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    char path[4096], data[100];
    memset(data, 'x', sizeof data);
    struct stat st;

    double t0 = now();
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%07ld", dir, i);
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) die("create", path);
        if (write(fd, data, sizeof data) != (ssize_t)sizeof data) die("write", path);
        if (close(fd) != 0) die("close", path);
    }
    double t1 = now();
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%07ld", dir, i);
        if (stat(path, &st) != 0 || st.st_size != sizeof data) die("stat", path);
    }
    double t2 = now();
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%07ld", dir, i);
        if (unlink(path) != 0) die("unlink", path);
    }
    double t3 = now();
    printf("create %.0f\nstat %.0f\nunlink %.0f\n", n / (t1 - t0), n / (t2 - t1), n / (t3 - t2));
    return 0;
}
