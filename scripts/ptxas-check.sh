#!/bin/sh
# ptxas-check.sh - fail a CUDA build whose kernels spill registers.
#
#   scripts/ptxas-check.sh NVCC_STDERR_FILE
#
# Reads what nvcc printed with -Xptxas -v for one .cu file: for each entry
# function, "Compiling entry function 'K' for 'sm_XX'" and then its
# "N bytes spill stores, M bytes spill loads". Prints every other line
# (compiler messages) to stderr, names each kernel that spills (demangled
# when c++filt is there) and exits 1 if any does, else 0. A spill goes
# through local memory on every access: in a hot kernel it costs more than
# anything else it does (the Makefile runs this after every nvcc).
set -eu
log=$1
demangle="cat"
command -v c++filt >/dev/null 2>&1 && demangle=c++filt
bad=$(awk '
	/^ptxas info *: Compiling entry function/ {
		k = $0; sub(/^[^'"'"']*'"'"'/, "", k); sub(/'"'"'.*/, "", k)
		a = $0; sub(/.*for '"'"'/, "", a); sub(/'"'"'.*/, "", a)
		next
	}
	/bytes spill stores/ {
		if (k != "" && ($5 + 0 > 0 || $9 + 0 > 0))
			printf "%s (%s): %s bytes spill stores, %s bytes spill loads\n", k, a, $5, $9
		k = ""
		next
	}
	/^ptxas info/ || /^    [0-9]+ bytes stack frame/ { next }
	{ print > "/dev/stderr" }
' "$log")
[ -z "$bad" ] && exit 0
echo "$bad" | $demangle | sed 's/^/ptxas-check: kernel spills registers: /' >&2
exit 1
