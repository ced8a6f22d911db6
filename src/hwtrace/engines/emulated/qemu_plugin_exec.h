/* hwtrace QEMU plugin: the command line that has an exec'd program run
 * under QEMU with the plugin too (qemu_plugin_exec.c; see follow_exec in
 * qemu_plugin.c). */
#ifndef HWTRACE_QEMU_PLUGIN_EXEC_H
#define HWTRACE_QEMU_PLUGIN_EXEC_H
#include <stddef.h>
#include <stdint.h>

/* If the kernel would run `target` (absolute) as an x86-64 ELF program or a
 * "#!" script whose interpreter is one (a regular executable file, not
 * set-id): the argv of this QEMU (its options up to "--" from
 * /proc/self/cmdline) running it with the guest's gargv[1..] and argv[0]
 * (-0), the plugin given its install arguments plugin_argv with
 * cont=next_id (out= last), and the guest's LD_* variables as -E options
 * (*qenv_out: the rest of genv, the environment to run QEMU with).  NULL
 * otherwise.  The strings are static or the caller's: one call per process. */
char **exec_command(const char *target, char **gargv, size_t gargc, char **genv,
                    char ***qenv_out, uint32_t next_id, int plugin_argc, char **plugin_argv);

#endif
