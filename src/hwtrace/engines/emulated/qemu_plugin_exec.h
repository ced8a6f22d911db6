/* hwtrace QEMU plugin: following execve (qemu_plugin_exec.c): the command
 * that has an exec'd program run under QEMU with the plugin too. */
#ifndef HWTRACE_QEMU_PLUGIN_EXEC_H
#define HWTRACE_QEMU_PLUGIN_EXEC_H
#include <stddef.h>
#include <stdint.h>

/* Keep the plugin's install arguments (for an exec'd image's plugin): its
 * cont=N (0: none, this instance starts the log). */
uint32_t exec_keep_args(int argc, char **argv);

/* At an execve (num 59) or execveat entry, its arguments a1..a5: the argv
 * of QEMU running the target under this plugin (cont=next_id), the
 * environment to run it with in *qenv; NULL where the target is left to
 * QEMU.  `logged` (PATH_MAX bytes): the path to log, absolute where
 * followed.  One call per process: the strings are static or its own. */
char **exec_follow(int64_t num, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                   uint64_t a5, uint32_t next_id, char *logged, char ***qenv);

#endif
