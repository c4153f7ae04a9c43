#!/bin/sh
# Open MPI's plm_rsh_agent for the namespace lab: `rsh-agent.sh HOST COMMAND...` runs COMMAND
# (joined and re-parsed by a shell, as ssh does) inside the lab namespace whose eth0 has the
# address HOST (10.77.0.<i+1> -> ${RCLAB_ID}-n<i>), in its own UTS namespace with its own
# hostname, so that Open MPI sees distinct nodes.
set -eu
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;
        *) break ;;
    esac
done
host=$1
shift
last=${host##*.}
ns="${RCLAB_ID:?RCLAB_ID is not set}-n$((last - 1))"
if [ -n "${RCLAB_LOG:-}" ]; then echo "agent: $host -> $ns" >>"$RCLAB_LOG"; fi
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && $*"
