/* Text pieces for the compiled formatters (branches/_c_format.c,
 * export/_c_textcols.c): a short copy and decimal integers.  Both write at
 * p, which has room, and return the end of what they wrote. */
#ifndef HWTRACE_TEXTPUT_H
#define HWTRACE_TEXTPUT_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* l bytes of s at p: short pieces (digits, a kind, a tag, a name) by two
 * overlapping fixed-size moves the compiler inlines -- memcpy of a
 * variable length is a libc call per piece, several per record (~10% of
 * an export's CPU) */
static inline char *put(char *p, const char *s, Py_ssize_t l)
{
    if (l > 32 || l < 0) {
        memcpy(p, s, (size_t)l);
    } else if (l >= 16) {
        char a[16], b[16];
        memcpy(a, s, 16);
        memcpy(b, s + l - 16, 16);
        memcpy(p, a, 16);
        memcpy(p + l - 16, b, 16);
    } else if (l >= 8) {
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + l - 8, 8);
        memcpy(p, &a, 8);
        memcpy(p + l - 8, &b, 8);
    } else if (l >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + l - 4, 4);
        memcpy(p, &a, 4);
        memcpy(p + l - 4, &b, 4);
    } else if (l > 0) {
        char a = s[0], b = s[l / 2], c = s[l - 1];
        p[0] = a;
        p[l / 2] = b;
        p[l - 1] = c;
    }
    return p + l;
}

/* "00" "01" ... "99" */
static const char DIG2[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* v in decimal, two digits a step (at most 20) */
static inline char *put_u64(char *p, uint64_t v)
{
    char tmp[24];
    char *e = tmp + sizeof(tmp), *q = e;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        q -= 2;
        memcpy(q, DIG2 + 2 * r, 2);
    }
    if (v >= 10) {
        q -= 2;
        memcpy(q, DIG2 + 2 * v, 2);
    } else {
        *--q = (char)('0' + v);
    }
    return put(p, q, e - q);
}

/* v in decimal, '-' first when negative (INT64_MIN included) */
static inline char *put_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return put_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(p, (uint64_t)v);
}

#endif
