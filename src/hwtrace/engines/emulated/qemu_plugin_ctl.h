/* hwtrace QEMU plugin: stopping mid-run (qemu_plugin_ctl.c) -- the page
 * shared with the recorder (qemu.py, Control), trigger functions, and the
 * terminal's or an outside kill(2)'s SIGINT/SIGHUP.  See qemu_plugin.c's
 * opening comment. */
#ifndef HWTRACE_QEMU_PLUGIN_CTL_H
#define HWTRACE_QEMU_PLUGIN_CTL_H
#include <stdbool.h>
#include <stdint.h>

struct hwctl {
    char magic[4];              /* "HWXC" */
    uint32_t version;           /* 1 */
    uint32_t stop;              /* set: nothing more is logged, by any process */
    uint32_t fired;             /* a trigger fired (claimed with a CAS) */
    uint32_t fired_pid, fired_tid;
    uint64_t fired_pc;
    char fired_name[128];
    uint32_t tty_signal;        /* the terminal's SIGINT/SIGHUP stopped the logging */
    uint32_t recorder;          /* the recorder's pid (0: unknown) */
};
#define MAX_TRIGGERS 16

extern struct hwctl *ctl;               /* NULL: no control page */
extern char *fifo_path;                 /* the recorder waits on it (fifo=) */
extern char *trig_names[MAX_TRIGGERS];  /* trigger= */
extern int ntrig;
extern int ntaddr;                      /* trigger entries resolved (the plugin's lock) */

/* Nothing more is logged, by any process. */
static inline bool stopped(void)
{
    return ctl && __atomic_load_n(&ctl->stop, __ATOMIC_ACQUIRE);
}

/* Map the control file (ctl=): 0, or -1 if it is not one. */
int ctl_open(const char *path);

/* A byte to the recorder's FIFO (async-signal-safe). */
void notify_recorder(void);

/* (Re)wrap QEMU's host handler of sig (SIGINT, SIGHUP). */
void wrap_signal(int sig);

/* The trigger functions of ELF file `path` in its mapping [lo, hi) of file
 * offset `off` (the caller holds the plugin's lock), and the trigger whose
 * entry is pc (-1: none). */
void resolve_triggers(const char *path, uint64_t lo, uint64_t hi, uint64_t off);
int trigger_at(uint64_t pc);

#endif
