#!/bin/sh
# layers.sh - the rooms of the source tree and the direction of their
# includes, checked against scripts/layers.txt.
#
#   scripts/layers.sh              check: every #include "..." of a file
#                                  under common/ controller/ agent/ runtime/
#                                  cli/ points into its own room or a lower
#                                  one; exit 1 naming each that does not
#   scripts/layers.sh --diagram    the room graph as text, highest room
#                                  first: each room and the rooms it includes
#   scripts/layers.sh --doc FILE   check that FILE holds the current diagram
#                                  between "<!-- layers:begin -->" and
#                                  "<!-- layers:end -->" (docs/ARCHITECTURE.md)
#   scripts/layers.sh --doc FILE --write   ... and rewrite it there
#
# A room is a directory (runtime/model, controller/api). layers.txt lists
# the rooms lowest first, one layer per line; rooms on one line are peers
# and may not include each other. An include is resolved as the compiler
# does: next to the file, then under each -I directory of the Makefile.
# A directory that is not in layers.txt is an error (a new room is placed
# on purpose). Part of `make lint`.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
table=scripts/layers.txt

mode=check doc="" write=0
while [ $# -gt 0 ]; do
	case $1 in
	--diagram) mode=diagram ;;
	--doc) mode=doc; doc=${2:?--doc needs a file}; shift ;;
	--write) write=1 ;;
	*) echo "layers: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

# Every source file, then every include of each: "FILE\tROOM-OF-TARGET\tTARGET".
edges=$(find common controller agent runtime cli -type f \
	\( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort |
	awk -v incdirs="common controller agent runtime cli" '
	function norm(p,   n, a, out, i, k, s) {
		n = split(p, a, "/"); k = 0
		for (i = 1; i <= n; i++) {
			if (a[i] == "." || a[i] == "") continue
			if (a[i] == ".." && k > 0) { k--; continue }
			s[++k] = a[i]
		}
		out = s[1]
		for (i = 2; i <= k; i++) out = out "/" s[i]
		return out
	}
	function dir(p) { sub(/\/[^\/]*$/, "", p); return p }
	function exists(p,   line, r) {
		r = (getline line < p); close(p); return r >= 0
	}
	BEGIN { nd = split(incdirs, I, " ") }
	{
		file = $0; d = dir(file)
		while ((getline line < file) > 0) {
			if (line !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
			inc = line; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
			target = ""
			if (exists(d "/" inc)) target = norm(d "/" inc)
			for (i = 1; target == "" && i <= nd; i++)
				if (exists(I[i] "/" inc)) target = norm(I[i] "/" inc)
			if (target != "") printf "%s\t%s\t%s\n", file, dir(target), target
		}
		close(file)
	}')

# ROOM LAYER for every room of the table; "" when the table is unreadable.
rooms=$(awk '!/^[ \t]*(#|$)/ { n++; for (i = 1; i <= NF; i++) print $i, n }' "$table")
[ -n "$rooms" ] || { echo "layers: $table lists no rooms" >&2; exit 1; }

check() {
	printf '%s\n' "$edges" | awk -F '\t' -v rooms="$rooms" -v table="$table" '
	function dir(p) { sub(/\/[^\/]*$/, "", p); return p }
	BEGIN {
		n = split(rooms, R, "\n")
		for (i = 1; i <= n; i++) { split(R[i], f, " "); layer[f[1]] = f[2] }
	}
	NF == 3 {
		from = dir($1); to = $2
		if (!(from in layer)) {
			if (!(from in told)) printf "layers: room %s (%s) is not in %s\n", from, $1, table
			told[from] = 1; bad = 1; next
		}
		if (!(to in layer)) {
			if (!(to in told)) printf "layers: room %s (%s) is not in %s\n", to, $3, table
			told[to] = 1; bad = 1; next
		}
		if (from == to || layer[to] < layer[from]) next
		how = layer[to] == layer[from] ? "its peer" : "a higher room"
		printf "layers: %s includes %s: %s is %s of %s (%s)\n", $1, $3, to, how, from, table
		bad = 1
	}
	END { exit bad }'
}

# The diagram: each room (highest layer first, as listed) and the rooms it
# includes, with the number of files that do.
diagram() {
	printf '%s\n' "$edges" | awk -F '\t' -v rooms="$rooms" '
	function dir(p) { sub(/\/[^\/]*$/, "", p); return p }
	BEGIN {
		n = split(rooms, R, "\n")
		for (i = 1; i <= n; i++) { split(R[i], f, " "); name[i] = f[1]; layer[f[1]] = f[2] }
	}
	NF == 3 {
		from = dir($1); to = $2
		if (from == to) next
		k = from SUBSEP to
		if (!(k SUBSEP $1 in seen)) { seen[k SUBSEP $1] = 1; files[k]++ }
	}
	END {
		print "layer  room                   includes (files)"
		for (i = n; i >= 1; i--) {
			r = name[i]; line = ""
			for (j = n; j >= 1; j--) {
				k = r SUBSEP name[j]
				if (k in files) line = line (line == "" ? "" : ", ") name[j] " (" files[k] ")"
			}
			printf "%-6s %-22s %s\n", layer[r], r, line == "" ? "-" : line
		}
	}'
}

case $mode in
check) check ;;
diagram) diagram ;;
doc)
	[ -f "$doc" ] || { echo "layers: $doc: no such file" >&2; exit 1; }
	if ! grep -q '^<!-- layers:begin -->$' "$doc" || ! grep -q '^<!-- layers:end -->$' "$doc"; then
		echo "layers: $doc has no <!-- layers:begin --> / <!-- layers:end --> block" >&2
		exit 1
	fi
	tmp=$(mktemp)
	trap 'rm -f "$tmp"' EXIT
	{
		sed '/^<!-- layers:begin -->$/q' "$doc"
		echo '```text'
		diagram
		echo '```'
		sed -n '/^<!-- layers:end -->$/,$p' "$doc"
	} >"$tmp"
	if cmp -s "$tmp" "$doc"; then
		exit 0
	elif [ $write -eq 1 ]; then
		cat "$tmp" >"$doc"
		echo "layers: $doc: diagram rewritten"
	else
		diff -u "$doc" "$tmp" | sed 's/^/layers: /' >&2 || true
		echo "layers: $doc: the room diagram is stale; run scripts/layers.sh --doc $doc --write" >&2
		exit 1
	fi ;;
esac
