#!/bin/sh
m=$1; shift
exec perf record -q -e cpu-clock -F 2000 --call-graph dwarf,8192 -o /tmp/perf-$m.$OMPI_COMM_WORLD_RANK "$@"
