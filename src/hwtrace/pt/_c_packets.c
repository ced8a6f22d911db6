/* Compiled core of hwtrace.pt.decoder: Intel PT packet scanning.
 *
 * The Python twin is hwtrace/pt/decoder.py; this file decodes exactly the
 * same packets, errors, offsets and resynchronization points (the tests
 * compare both on the corpus, on mutations and at every byte offset).
 * The boundary is narrow and stateless:
 *
 *   decode(buf, pos, flags)          -> packet record or PtError at pos
 *   PacketIter(dec, buf, pos, sync, flags)
 *                                    the packets() loop: records and
 *                                    PtErrors, resync at the next PSB;
 *                                    stores dec._pos/_sync like the twin
 *   count(buf, pos, sync, flags)     -> (packets, errors, pos, sync): the
 *                                    same loop without creating objects
 *   find_psb_forward(buf, start)     -> offset or -1
 *
 * ``buf`` is a bytes object, ``pos`` < len(buf) for decode().  ``flags``
 * are the FLAG_* constants (errata and libipt-2.0 switches).  Records are
 * the NamedTuple classes of hwtrace.pt.packets, built like tuple.__new__.
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 1

enum {
    FLAG_SKD007 = 1,   /* CYC + 0xf3 decodes as OVF (3 bytes consumed) */
    FLAG_SKZ84 = 2,    /* a TMA with reserved bits is an 8-byte Invalid */
    FLAG_NO_CFE = 4,   /* packet types decoded as unknown opcodes */
    FLAG_NO_EVD = 8,
    FLAG_NO_TRIG = 16,
};

/* Results of decode_at(): > 0 bytes consumed, or one of these. */
enum { R_EOS = -1, R_BAD_OPC = -2, R_BAD_PACKET = -3 };

enum kind {
    K_PAD, K_PSB, K_PSBEND, K_OVF, K_STOP, K_TNT8, K_TNT64, K_TIP,
    K_TIP_PGE, K_TIP_PGD, K_FUP, K_MODE_EXEC, K_MODE_TSX, K_PIP, K_TSC,
    K_CBR, K_TMA, K_MTC, K_CYC, K_VMCS, K_MNT, K_EXSTOP, K_MWAIT, K_PWRE,
    K_PWRX, K_PTW, K_CFE, K_EVD, K_TRIG, K_INVALID, K_COUNT
};

static const char *const kind_class[K_COUNT] = {
    "Pad", "Psb", "Psbend", "Ovf", "Stop", "Tnt8", "Tnt64", "Tip",
    "TipPge", "TipPgd", "Fup", "ModeExec", "ModeTsx", "Pip", "Tsc",
    "Cbr", "Tma", "Mtc", "Cyc", "Vmcs", "Mnt", "Exstop", "Mwait", "Pwre",
    "Pwrx", "Ptw", "Cfe", "Evd", "Trig", "Invalid"};

/* payload fields per kind (records have offset, size, then these) */
static const unsigned char kind_nfields[K_COUNT] = {
    0, 0, 0, 0, 0, 2, 2, 2,
    2, 2, 2, 3, 2, 2, 1,
    1, 2, 1, 1, 1, 1, 1, 2, 3,
    5, 3, 3, 2, 5, 1};

struct pkt {
    int kind;
    int size;           /* the record's size (SKD007: 2, consumes 3) */
    uint64_t f[5];
};

/* Set once at module initialization, never changed afterwards. */
static PyTypeObject *classes[K_COUNT];
static PyTypeObject *pterror_class;
static PyObject *err_str[4];    /* indexed by -R_*: EOS, BAD_OPC, BAD_PACKET */
static PyObject *empty_str;
static PyObject *str_pos, *str_sync;

static const uint8_t psb_bytes[16] = {
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82};

static inline uint64_t le(const uint8_t *s, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | s[i];
    return v;
}

static inline int bitlen(uint64_t v)
{
    return v ? 64 - __builtin_clzll(v) : 0;
}

#define NEED(n) do { if (p + (n) > e) return R_EOS; } while (0)
#define OUT(k, sz) (out->kind = (k), out->size = (sz))

static int decode_cyc(const uint8_t *b, Py_ssize_t p, Py_ssize_t e,
                      struct pkt *out)
{
    uint8_t v = b[p];
    uint64_t value = v >> 3;
    if (!(v & 4)) {
        OUT(K_CYC, 1);
        out->f[0] = value;
        return 1;
    }
    Py_ssize_t q = p + 1;
    int shl = 5;
    for (;;) {
        if (q >= e)
            return R_EOS;
        uint8_t x = b[q++];
        if (shl < 64)
            value |= (uint64_t)(x >> 1) << shl;
        shl += 7;
        if (shl > 64)
            return R_BAD_PACKET;
        if (!(x & 1)) {
            OUT(K_CYC, (int)(q - p));
            out->f[0] = value;
            return (int)(q - p);
        }
    }
}

static int decode_ext(const uint8_t *b, Py_ssize_t p, Py_ssize_t e,
                      unsigned flags, struct pkt *out)
{
    if (p + 1 >= e)
        return R_EOS;
    uint8_t x = b[p + 1];
    uint64_t *f = out->f;
    if ((x & 0x1f) == 0x12) {           /* PTW */
        int plc = (x >> 5) & 3, n;
        if (plc == 0)
            n = 4;
        else if (plc == 1)
            n = 8;
        else
            return R_BAD_PACKET;
        NEED(2 + n);
        OUT(K_PTW, 2 + n);
        f[0] = plc; f[1] = le(b + p + 2, n); f[2] = x >> 7;
        return 2 + n;
    }
    switch (x) {
    case 0x82:
        NEED(16);
        if (memcmp(b + p, psb_bytes, 16))
            return R_BAD_PACKET;
        OUT(K_PSB, 16);
        return 16;
    case 0x23: OUT(K_PSBEND, 2); return 2;
    case 0xf3: OUT(K_OVF, 2); return 2;
    case 0x83: OUT(K_STOP, 2); return 2;
    case 0xa3: {
        NEED(8);
        uint64_t v = le(b + p + 2, 6);
        int n = bitlen(v) - 1;
        if (n <= 0)
            return R_BAD_PACKET;
        OUT(K_TNT64, 8);
        f[0] = n; f[1] = v ^ ((uint64_t)1 << n);
        return 8;
    }
    case 0x43: {
        NEED(8);
        uint64_t v = le(b + p + 2, 6);
        OUT(K_PIP, 8);
        f[0] = (v >> 1) << 5; f[1] = v & 1;
        return 8;
    }
    case 0x03:
        NEED(4);
        OUT(K_CBR, 4);
        f[0] = b[p + 2];
        return 4;
    case 0x73: {
        NEED(7);
        unsigned fc = b[p + 5] | (unsigned)b[p + 6] << 8;
        if ((fc & ~0x1ffu) || b[p + 4]) {
            if (!(flags & FLAG_SKZ84))
                return R_BAD_PACKET;
            OUT(K_INVALID, 8);
            f[0] = 0;
            return 8;       /* may run past the end, like the twin */
        }
        OUT(K_TMA, 7);
        f[0] = b[p + 2] | (unsigned)b[p + 3] << 8; f[1] = fc;
        return 7;
    }
    case 0xc8:
        NEED(7);
        OUT(K_VMCS, 7);
        f[0] = le(b + p + 2, 5) << 12;
        return 7;
    case 0xc3:
        if (p + 2 >= e)
            return R_EOS;
        if (b[p + 2] != 0x88)
            return R_BAD_OPC;
        NEED(11);
        OUT(K_MNT, 11);
        f[0] = le(b + p + 3, 8);
        return 11;
    case 0x62:
    case 0xe2:
        OUT(K_EXSTOP, 2);
        f[0] = x >> 7;
        return 2;
    case 0xc2:
        NEED(10);
        OUT(K_MWAIT, 10);
        f[0] = le(b + p + 2, 4); f[1] = le(b + p + 6, 4);
        return 10;
    case 0x22: {
        NEED(4);
        uint8_t v = b[p + 3];
        OUT(K_PWRE, 4);
        f[0] = v >> 4; f[1] = v & 0xf; f[2] = (b[p + 2] >> 3) & 1;
        return 4;
    }
    case 0xa2: {
        NEED(7);
        uint8_t v = b[p + 2], w = b[p + 3];
        OUT(K_PWRX, 7);
        f[0] = v >> 4; f[1] = v & 0xf; f[2] = w & 1;
        f[3] = (w >> 2) & 1; f[4] = (w >> 3) & 1;
        return 7;
    }
    case 0x13:
        if (flags & FLAG_NO_CFE)
            return R_BAD_OPC;
        NEED(4);
        OUT(K_CFE, 4);
        f[0] = b[p + 2] & 0x1f; f[1] = b[p + 3]; f[2] = b[p + 2] >> 7;
        return 4;
    case 0x53:
        if (flags & FLAG_NO_EVD)
            return R_BAD_OPC;
        NEED(11);
        OUT(K_EVD, 11);
        f[0] = b[p + 2] & 0x1f; f[1] = le(b + p + 3, 8);
        return 11;
    default:
        return R_BAD_OPC;
    }
}

/* payload bytes per IP compression; -1: reserved (unknown packet) */
static const signed char ipc_size[8] = {0, 2, 4, 6, 6, -1, 8, -1};

/* Decode the packet at b[p] (p < e).  Returns the bytes consumed (> 0)
 * with *out filled in, or an R_* error. */
static inline int decode_at(const uint8_t *b, Py_ssize_t p, Py_ssize_t e,
                            unsigned flags, struct pkt *out)
{
    uint8_t x = b[p];
    uint64_t *f = out->f;
    if (!(x & 1)) {
        if (x >= 4) {                   /* TNT-8 */
            unsigned v = x >> 1;
            int n = bitlen(v) - 1;
            OUT(K_TNT8, 1);
            f[0] = n; f[1] = v ^ (1u << n);
            return 1;
        }
        if (x == 0) {
            OUT(K_PAD, 1);
            return 1;
        }
        return decode_ext(b, p, e, flags, out);
    }
    if ((x & 3) == 3) {
        int r = decode_cyc(b, p, e, out);
        if ((flags & FLAG_SKD007) && r == 2 && (f[0] & ~(uint64_t)0x1f) == 0x20
                && p + 2 < e && b[p + 2] == 0xf3) {
            OUT(K_OVF, 2);
            return 3;
        }
        return r;
    }
    int k;
    switch (x & 0x1f) {
    case 0x0d: k = K_TIP; break;
    case 0x11: k = K_TIP_PGE; break;
    case 0x01: k = K_TIP_PGD; break;
    case 0x1d: k = K_FUP; break;
    default:
        switch (x) {
        case 0x99:
            NEED(2);
            {
                uint8_t v = b[p + 1];
                if ((v & 0xe0) == 0) {
                    OUT(K_MODE_EXEC, 2);
                    f[0] = v & 1; f[1] = (v >> 1) & 1; f[2] = (v >> 2) & 1;
                    return 2;
                }
                if ((v & 0xe0) == 0x20) {
                    OUT(K_MODE_TSX, 2);
                    f[0] = v & 1; f[1] = (v >> 1) & 1;
                    return 2;
                }
                return R_BAD_PACKET;
            }
        case 0x19:
            NEED(8);
            OUT(K_TSC, 8);
            f[0] = le(b + p + 1, 7);
            return 8;
        case 0x59:
            NEED(2);
            OUT(K_MTC, 2);
            f[0] = b[p + 1];
            return 2;
        case 0xd9:
            if (flags & FLAG_NO_TRIG)
                return R_BAD_OPC;
            NEED(3);
            {
                uint8_t fl = b[p + 1];
                int n = (fl & 0x40) ? 5 : 3;
                NEED(n);
                OUT(K_TRIG, n);
                f[0] = b[p + 2];
                f[1] = n == 5 ? (b[p + 3] | (unsigned)b[p + 4] << 8) : 0;
                f[2] = fl >> 7; f[3] = n == 5; f[4] = (fl >> 5) & 1;
                return n;
            }
        default:
            return R_BAD_OPC;
        }
    }
    int ipc = x >> 5, n = ipc_size[ipc];
    if (n < 0)
        return R_BAD_PACKET;
    NEED(n + 1);
    OUT(k, n + 1);
    f[0] = ipc; f[1] = n ? le(b + p + 1, n) : 0;
    return n + 1;
}

/* libipt's pt_find_psb around an aligned PSB-pattern word at pos. */
static Py_ssize_t psb_around_word(const uint8_t *b, Py_ssize_t end,
                                  Py_ssize_t pos)
{
    if (b[pos] != 0x02)
        pos++;
    while (pos + 1 < end && b[pos] == 0x02 && b[pos + 1] == 0x82)
        pos += 2;
    pos -= 16;
    if (pos < 0 || memcmp(b + pos, psb_bytes, 16))
        return -1;
    return pos;
}

static Py_ssize_t find_psb(const uint8_t *b, Py_ssize_t end, Py_ssize_t start)
{
    static const uint8_t w1[8] = {2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82};
    static const uint8_t w2[8] = {0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2};
    for (Py_ssize_t i = (start + 7) & ~(Py_ssize_t)7; i + 8 <= end; i += 8) {
        if (b[i] != 2 && b[i] != 0x82)
            continue;
        if (memcmp(b + i, w1, 8) && memcmp(b + i, w2, 8))
            continue;
        Py_ssize_t found = psb_around_word(b, end, i);
        if (found >= start)
            return found;
    }
    return -1;
}

/* Where the twin's sync_forward() searches from, given (pos, sync). */
static Py_ssize_t resync_start(Py_ssize_t pos, Py_ssize_t sync)
{
    if (pos == sync)
        pos += 16;
    return pos - (pos < 15 ? pos : 15);
}

/* ---- Python objects ---------------------------------------------------- */

static PyObject *new_tuple(PyTypeObject *cls, Py_ssize_t n)
{
    return cls->tp_alloc(cls, n);
}

static PyObject *make_record(const struct pkt *k, Py_ssize_t offset)
{
    int nf = kind_nfields[k->kind];
    PyObject *t = new_tuple(classes[k->kind], 2 + nf), *v;
    if (!t)
        return NULL;
    if (!(v = PyLong_FromSsize_t(offset)))
        goto fail;
    PyTuple_SET_ITEM(t, 0, v);
    if (!(v = PyLong_FromLong(k->size)))
        goto fail;
    PyTuple_SET_ITEM(t, 1, v);
    for (int i = 0; i < nf; i++) {
        if (!(v = PyLong_FromUnsignedLongLong(k->f[i])))
            goto fail;
        PyTuple_SET_ITEM(t, 2 + i, v);
    }
    return t;
fail:
    Py_DECREF(t);
    return NULL;
}

static PyObject *make_error(int r, Py_ssize_t offset)
{
    PyObject *t = new_tuple(pterror_class, 3), *v;
    if (!t)
        return NULL;
    Py_INCREF(err_str[-r]);
    PyTuple_SET_ITEM(t, 0, err_str[-r]);
    if (!(v = PyLong_FromSsize_t(offset))) {
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 1, v);
    Py_INCREF(empty_str);
    PyTuple_SET_ITEM(t, 2, empty_str);
    return t;
}

static int get_bytes(PyObject *o, const uint8_t **b, Py_ssize_t *n)
{
    if (!PyBytes_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "expected bytes");
        return -1;
    }
    *b = (const uint8_t *)PyBytes_AS_STRING(o);
    *n = PyBytes_GET_SIZE(o);
    return 0;
}

static int get_ssize(PyObject *o, Py_ssize_t *v)
{
    *v = PyLong_AsSsize_t(o);
    return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* decode(buf, pos, flags): the packet at pos (0 <= pos < len(buf)). */
static PyObject *py_decode(PyObject *self, PyObject *const *args,
                           Py_ssize_t nargs)
{
    const uint8_t *b;
    Py_ssize_t e, p, flags;
    struct pkt k;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(buf, pos, flags)");
        return NULL;
    }
    if (get_bytes(args[0], &b, &e) || get_ssize(args[1], &p)
            || get_ssize(args[2], &flags))
        return NULL;
    if (p < 0 || p >= e)
        return make_error(R_EOS, p);
    int r = decode_at(b, p, e, (unsigned)flags, &k);
    return r > 0 ? make_record(&k, p) : make_error(r, p);
}

/* count(buf, pos, sync, flags) -> (packets, errors, pos, sync) */
static PyObject *py_count(PyObject *self, PyObject *const *args,
                          Py_ssize_t nargs)
{
    const uint8_t *b;
    Py_ssize_t e, pos, sync, flags, npk = 0, nerr = 0;
    struct pkt k;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "count(buf, pos, sync, flags)");
        return NULL;
    }
    if (get_bytes(args[0], &b, &e) || get_ssize(args[1], &pos)
            || get_ssize(args[2], &sync) || get_ssize(args[3], &flags))
        return NULL;
    unsigned fl = (unsigned)flags;
    Py_BEGIN_ALLOW_THREADS
    while (pos < e) {
        int r = decode_at(b, pos, e, fl, &k);
        if (r > 0) {
            pos += r;
            npk++;
            continue;
        }
        if (r == R_EOS)
            break;
        nerr++;
        Py_ssize_t found = find_psb(b, e, resync_start(pos, sync));
        if (found < 0)
            break;
        pos = sync = found;
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(nnnn)", npk, nerr, pos, sync);
}

static PyObject *py_find_psb_forward(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs)
{
    const uint8_t *b;
    Py_ssize_t e, start;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "find_psb_forward(buf, start)");
        return NULL;
    }
    if (get_bytes(args[0], &b, &e) || get_ssize(args[1], &start))
        return NULL;
    if (start < 0)
        start = 0;
    return PyLong_FromSsize_t(find_psb(b, e, start));
}

/* ---- PacketIter: the packets() loop ------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *dec;      /* the PacketDecoder whose _pos/_sync we keep */
    PyObject *buf;
    Py_ssize_t pos, sync;
    unsigned flags;
    int done;           /* exhausted: position stored */
    int resync;         /* an error was yielded: resync next */
} PacketIter;

/* Store pos (and sync) into the decoder, as the twin's finally clause and
 * sync_forward() do.  Preserves a pending exception. */
static int store_position(PacketIter *it, int with_sync)
{
    PyObject *exc_type, *exc_value, *exc_tb, *v;
    int rc = 0;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    v = PyLong_FromSsize_t(it->pos);
    if (!v || PyObject_SetAttr(it->dec, str_pos, v) < 0)
        rc = -1;
    Py_XDECREF(v);
    if (rc == 0 && with_sync) {
        v = PyLong_FromSsize_t(it->sync);
        if (!v || PyObject_SetAttr(it->dec, str_sync, v) < 0)
            rc = -1;
        Py_XDECREF(v);
    }
    if (rc == 0)
        PyErr_Restore(exc_type, exc_value, exc_tb);
    else {
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
    }
    return rc;
}

static PyObject *iter_finish(PacketIter *it)
{
    if (!it->done) {
        it->done = 1;
        store_position(it, 1);
    }
    return NULL;
}

static PyObject *iter_next(PacketIter *it)
{
    if (it->done)
        return NULL;
    const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(it->buf);
    Py_ssize_t e = PyBytes_GET_SIZE(it->buf), p;
    struct pkt k;
    if (it->resync) {
        /* after an error: the twin's sync_forward() on resuming */
        it->resync = 0;
        Py_ssize_t found = find_psb(b, e, resync_start(it->pos, it->sync));
        if (found < 0) {
            it->done = 1;       /* offset stays at the error */
            return NULL;
        }
        it->pos = it->sync = found;
        if (store_position(it, 1) < 0)
            return NULL;
    }
    p = it->pos;
    if (p >= e)
        return iter_finish(it);
    int r = decode_at(b, p, e, it->flags, &k);
    if (r > 0) {
        PyObject *rec = make_record(&k, p);
        if (rec)
            it->pos = p + r;
        return rec;
    }
    if (r == R_EOS)
        return iter_finish(it);
    PyObject *err = make_error(r, p);
    if (!err || store_position(it, 0) < 0) {
        Py_XDECREF(err);
        return NULL;
    }
    it->resync = 1;
    return err;
}

static PyObject *iter_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *dec, *buf;
    Py_ssize_t pos, sync, flags;
    if (!PyArg_ParseTuple(args, "OSnnn:PacketIter", &dec, &buf, &pos, &sync,
                          &flags))
        return NULL;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "negative position");
        return NULL;
    }
    PacketIter *it = (PacketIter *)type->tp_alloc(type, 0);
    if (!it)
        return NULL;
    Py_INCREF(dec);
    Py_INCREF(buf);
    it->dec = dec;
    it->buf = buf;
    it->pos = pos;
    it->sync = sync;
    it->flags = (unsigned)flags;
    it->done = 0;
    it->resync = 0;
    return (PyObject *)it;
}

static void iter_dealloc(PacketIter *it)
{
    PyObject_GC_UnTrack(it);
    if (!it->done && it->dec) {
        it->done = 1;
        if (store_position(it, 1) < 0)
            PyErr_WriteUnraisable((PyObject *)it);
    }
    Py_CLEAR(it->dec);
    Py_CLEAR(it->buf);
    Py_TYPE(it)->tp_free((PyObject *)it);
}

static int iter_traverse(PacketIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->dec);
    Py_VISIT(it->buf);
    return 0;
}

static int iter_clear(PacketIter *it)
{
    it->done = 1;
    Py_CLEAR(it->dec);
    Py_CLEAR(it->buf);
    return 0;
}

static PyTypeObject PacketIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hwtrace.pt._c_packets.PacketIter",
    .tp_basicsize = sizeof(PacketIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "PacketIter(decoder, buf, pos, sync, flags): packets() loop",
    .tp_new = iter_new,
    .tp_dealloc = (destructor)iter_dealloc,
    .tp_traverse = (traverseproc)iter_traverse,
    .tp_clear = (inquiry)iter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iter_next,
};

/* ---- module ------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL,
     "decode(buf, pos, flags) -> the packet record or PtError at pos"},
    {"count", (PyCFunction)(void (*)(void))py_count, METH_FASTCALL,
     "count(buf, pos, sync, flags) -> (packets, errors, pos, sync)"},
    {"find_psb_forward", (PyCFunction)(void (*)(void))py_find_psb_forward,
     METH_FASTCALL, "find_psb_forward(buf, start) -> offset or -1"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_c_packets",
    "Compiled Intel PT packet scanner (twin: hwtrace.pt.decoder).", -1,
    methods
};

static int get_class(PyObject *mod, const char *name, PyTypeObject **out)
{
    PyObject *c = PyObject_GetAttrString(mod, name);
    if (!c)
        return -1;
    if (!PyType_Check(c) || !PyType_IsSubtype((PyTypeObject *)c,
                                               &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "%s is not a tuple type", name);
        Py_DECREF(c);
        return -1;
    }
    *out = (PyTypeObject *)c;       /* reference kept for the process */
    return 0;
}

static int get_str(PyObject *mod, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(mod, name);
    return *out ? 0 : -1;
}

PyMODINIT_FUNC PyInit__c_packets(void)
{
    PyObject *m = NULL, *pk = NULL, *er = NULL;
    pk = PyImport_ImportModule("hwtrace.pt.packets");
    er = PyImport_ImportModule("hwtrace.pt.errors");
    if (!pk || !er)
        goto fail;
    for (int i = 0; i < K_COUNT; i++)
        if (get_class(pk, kind_class[i], &classes[i]))
            goto fail;
    if (get_class(er, "PtError", &pterror_class)
            || get_str(er, "EOS", &err_str[-R_EOS])
            || get_str(er, "BAD_OPC", &err_str[-R_BAD_OPC])
            || get_str(er, "BAD_PACKET", &err_str[-R_BAD_PACKET]))
        goto fail;
    empty_str = PyUnicode_FromString("");
    str_pos = PyUnicode_InternFromString("_pos");
    str_sync = PyUnicode_InternFromString("_sync");
    if (!empty_str || !str_pos || !str_sync)
        goto fail;
    if (PyType_Ready(&PacketIterType) < 0)
        goto fail;
    m = PyModule_Create(&moduledef);
    if (!m)
        goto fail;
    Py_INCREF(&PacketIterType);
    if (PyModule_AddObject(m, "PacketIter", (PyObject *)&PacketIterType) < 0
            || PyModule_AddIntConstant(m, "ABI", ABI) < 0
            || PyModule_AddStringConstant(m, "SOURCE_SHA256",
                                          HWTRACE_SOURCE_SHA256) < 0
            || PyModule_AddIntConstant(m, "FLAG_SKD007", FLAG_SKD007) < 0
            || PyModule_AddIntConstant(m, "FLAG_SKZ84", FLAG_SKZ84) < 0
            || PyModule_AddIntConstant(m, "FLAG_NO_CFE", FLAG_NO_CFE) < 0
            || PyModule_AddIntConstant(m, "FLAG_NO_EVD", FLAG_NO_EVD) < 0
            || PyModule_AddIntConstant(m, "FLAG_NO_TRIG", FLAG_NO_TRIG) < 0)
        goto fail;
    Py_DECREF(pk);
    Py_DECREF(er);
    return m;
fail:
    Py_XDECREF(m);
    Py_XDECREF(pk);
    Py_XDECREF(er);
    return NULL;
}
