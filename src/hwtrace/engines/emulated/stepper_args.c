/* hwtrace ptrace stepper: its command line (stepper.c's opening comment
 * lists the options) into `opt`. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "stepper.h"

static uint64_t parse_addr(const char *s, int *rel);

/* An address, +OFF, or FILE@OFF (then *file = FILE). */
static uint64_t parse_trigger(const char *s, int *rel, const char **file)
{
    const char *at = strrchr(s, '@');
    if (at && at != s) {
        char *f = strndup(s, (size_t)(at - s));
        if (!f) fail("out of memory");
        *file = f;
        int r;
        uint64_t v = parse_addr(at + 1, &r);
        if (r) fail("bad address: %s", s);
        return v;
    }
    return parse_addr(s, rel);
}

static uint64_t parse_addr(const char *s, int *rel)
{
    *rel = s[0] == '+';
    char *end;
    errno = 0;
    uint64_t v = strtoull(s + *rel, &end, 0);
    if (errno || *end || end == s + *rel) fail("bad address: %s", s);
    return v;
}

static void usage(void)
{
    fail("usage: stepper [--start A] [--stop A] [--within A] [--no-follow-fork] [--clock tsc|insn] "
         "[--block auto|off] [--cpu-every N] [--quiet-errors] -o LOG (-- PROGRAM ARGS... | --pid PID)");
}

void parse_options(int argc, char **argv)
{
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) { i++; break; }
        else if (!strcmp(a, "--quiet-errors")) opt.quiet = 1;
        else if (!strcmp(a, "--no-follow-fork")) opt.follow_fork = 0;
        else if (!v) usage();
        else if (!strcmp(a, "-o")) { opt.out = v; i++; }
        else if (!strcmp(a, "--pid")) { opt.attach = atoi(v); i++; if (opt.attach <= 0) fail("bad pid: %s", v); }
        else if (!strcmp(a, "--start")) { opt.start = parse_trigger(v, &opt.start_rel, &opt.start_file); i++; }
        else if (!strcmp(a, "--stop")) { opt.stop = parse_trigger(v, &opt.stop_rel, &opt.stop_file); i++; }
        else if (!strcmp(a, "--within")) { opt.within = parse_trigger(v, &opt.within_rel, &opt.within_file); i++; }
        else if (!strcmp(a, "--clock")) { opt.clock_insn = !strcmp(v, "insn"); if (!opt.clock_insn && strcmp(v, "tsc")) usage(); i++; }
        else if (!strcmp(a, "--block")) { opt.block = strcmp(v, "off") != 0; i++; }
        else if (!strcmp(a, "--quantum")) { opt.quantum = (unsigned)atoi(v); i++; }
        else if (!strcmp(a, "--accel")) { opt.accel = strcmp(v, "off") != 0; i++; }
        else if (!strcmp(a, "--cpu-every")) { opt.cpu_every = (unsigned)atoi(v); if (!opt.cpu_every) opt.cpu_every = 1; i++; }
        else usage();
    }
    if (!opt.out) usage();
    snprintf(errpath, sizeof errpath, "%s.err", opt.out);
    unlink(errpath);
    if (i < argc) opt.argv = argv + i;
    if (!opt.argv == !opt.attach) usage();
}
