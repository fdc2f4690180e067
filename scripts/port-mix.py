#!/usr/bin/env python3
"""Which instructions take the int8 kernels' `vpdpbusd` slots, on this core.

Each case is a loop of 16 independent zmm `vpdpbusd` plus a few other instructions on chains of
their own, written in assembly (a compiler would fold or move them); the loop's cycles per
iteration against the 16 of `vpdpbusd` alone say which instructions compete with it for its
pipes. The clock is taken as --ghz (default 3.7); only the ratios between cases matter.
Needs gcc and an AVX-512 VNNI CPU. Usage: scripts/port-mix.py [--ghz 3.7]
"""
import os
import subprocess
import sys
import tempfile

CASES = {
    "16 vpdpbusd": [],
    "+ 4 vpaddd": ["vpaddd %zmm20,%zmm{r},%zmm{r}"] * 4,
    "+ 4 vpandd": ["vpandd %zmm20,%zmm{r},%zmm{r}"] * 4,
    "+ 4 vpsrlw": ["vpsrlw $4,%zmm{r},%zmm{r}"] * 4,
    "+ 4 vpbroadcastd from memory": ["vpbroadcastd (%rsp),%zmm{r}"] * 4,
    "+ 4 vcvtdq2ps": ["vcvtdq2ps %zmm{r},%zmm{r}"] * 4,
    "+ 4 vaddps": ["vaddps %zmm20,%zmm{r},%zmm{r}"] * 4,
    "+ 2 vpmulld": ["vpmulld %zmm20,%zmm{r},%zmm{r}"] * 2,
    "+ 4 vmulps": ["vmulps %zmm20,%zmm{r},%zmm{r}"] * 4,
    "+ 4 vpmaddwd": ["vpmaddwd %zmm20,%zmm19,%zmm{r}"] * 4,
    "+ 4 vpdpwssd": ["vpdpwssd %zmm20,%zmm19,%zmm{r}"] * 4,
    "+ 2 vpmulld + 4 vpaddd": ["vpmulld %zmm20,%zmm{r},%zmm{r}"] * 2
    + ["vpaddd %zmm20,%zmm{r},%zmm{r}"] * 4,
}


def main():
    ghz = float(sys.argv[sys.argv.index("--ghz") + 1]) if "--ghz" in sys.argv else 3.7
    src = [
        "#include <stdio.h>",
        "#include <time.h>",
        "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);"
        " return t.tv_sec + t.tv_nsec * 1e-9; }",
    ]
    for i, extra in enumerate(CASES.values()):
        body = "".join(f'"vpdpbusd %%zmm17,%%zmm18,%%zmm{k}\\n\\t"' for k in range(16))
        # Each extra instruction on its own register (zmm21..), so none waits on another.
        body += "".join(
            '"' + e.format(r=21 + j).replace("%", "%%") + '\\n\\t"' for j, e in enumerate(extra)
        )
        src.append(
            f"static void case{i}(long n) {{ __asm__ volatile(\"sub $64, %%rsp\\n\\t\" \"1:\\n\\t\" "
            f"{body} \"dec %0\\n\\t\" \"jnz 1b\\n\\t\" \"add $64, %%rsp\\n\\t\" "
            f': "+r"(n) :: "memory", "cc"); }}'
        )
    src.append("int main(void) { long n = 200000000; double t;")
    for i, name in enumerate(CASES):
        src.append(
            f"t = now(); case{i}(n); t = now() - t; "
            f'printf("%-32s %6.2f cycles an iteration\\n", "{name}", t * {ghz}e9 / n);'
        )
    src.append("return 0; }")
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "mix.c"), os.path.join(d, "mix")
        with open(c, "w") as f:
            f.write("\n".join(src))
        subprocess.run(["gcc", "-O2", "-march=native", c, "-o", exe], check=True)
        subprocess.run([exe], check=True)


if __name__ == "__main__":
    main()
