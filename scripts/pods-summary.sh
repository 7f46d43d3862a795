#!/bin/sh
# pods-summary.sh - the last line of make test-pods, from the "KEY VALUE"
# lines tests/pods/test_pods.c wrote (MESHRUN_PODS_SUMMARY): how many hosts
# (namespaces) a test used at most, the jobs whose losses equalled their
# reference, and the partitions survived.
#
#   scripts/pods-summary.sh FILE
[ -s "${1:-}" ] || { echo "pods: no summary (the tests were skipped: see above)"; exit 0; }
awk '$1 == "hosts" && $2 > h { h = $2 }
	$1 == "job" { n++; k += $2 }
	$1 == "partition" { p += $2 }
	$1 == "partition_tried" { t += $2 }
	$1 == "stale_publish" { s += $2 }
	$1 == "kv_lost" { l += $2 }
	$1 == "kv_acked" { w += $2 }
	END { printf "pods hosts=%d jobs_equal=%d/%d partitions=%d/%d stale_publish=%d " \
		"lost_writes=%d/%d\n", h, k, n, p, t, s, l, w }' "$1"
