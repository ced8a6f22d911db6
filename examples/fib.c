/* The bundled example: a small program with a known call structure.
 * fib(n) makes 2*fib(n+1)-1 calls to itself; main prints the result. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static unsigned long fib(unsigned n)
{
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

__attribute__((noinline)) static void report(unsigned n, unsigned long v)
{
    printf("fib(%u) = %lu\n", n, v);
}

int main(int argc, char **argv)
{
    unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 10;
    report(n, fib(n));
    return 0;
}
