/* The decoder's configuration from Python: the tuple
 * hwtrace.flow.fast._config_tuple builds, into a struct core_config. */
#include "pyconfig.h"

int parse_config(PyObject *t, struct core_config *c)
{
    unsigned long long errata, addr_cfg, a[4], b[4], mtc, nom, eax, ebx;
    int tick, iflags, keep, off20, eoc, eoj, strict;
    memset(c, 0, sizeof *c);
    if (!PyArg_ParseTuple(t, "KK(KKKK)(KKKK)KKKKppppppp;config", &errata,
                          &addr_cfg, &a[0], &a[1], &a[2], &a[3], &b[0], &b[1],
                          &b[2], &b[3], &mtc, &nom, &eax, &ebx, &tick, &iflags,
                          &keep, &off20, &eoc, &eoj, &strict))
        return -1;
    c->bdm70 = errata & 1;
    c->bdm64 = (errata >> 1) & 1;
    c->skd007 = (errata >> 2) & 1;
    c->skd022 = (errata >> 3) & 1;
    c->skd010 = (errata >> 4) & 1;
    c->skl014 = (errata >> 5) & 1;
    c->apl12 = (errata >> 6) & 1;
    c->apl11 = (errata >> 7) & 1;
    c->skl168 = (errata >> 8) & 1;
    c->skz84 = (errata >> 9) & 1;
    c->pflags = (c->skd007 ? PT_FLAG_SKD007 : 0) |
                (c->skz84 ? PT_FLAG_SKZ84 : 0);
    c->addr_cfg = addr_cfg;
    for (int i = 0; i < 4; i++) {
        c->addr_a[i] = a[i];
        c->addr_b[i] = b[i];
    }
    c->mtc_freq = mtc;
    c->nom_freq = nom;
    c->eax = eax;
    c->ebx = ebx;
    c->tick = tick;
    c->iflags = iflags;
    c->keep_tcal = keep;
    c->offsets20 = off20;
    c->end_on_call = eoc;
    c->end_on_jump = eoj;
    c->strict = strict;
    return 0;
}
