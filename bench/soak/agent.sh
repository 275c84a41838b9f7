#!/bin/sh
# The soak's stand-in agent. Arguments: the runner incarnation that started
# it and the directory of run records. It appends a start line and, unless
# it is killed, an end line to the record of its job:
#   start <attempt> <incarnation> <unix ns>
#   end <attempt> <incarnation> <exit code> <unix ns>
# Stopped by its runner (SIGTERM: a lost lease, a cancel, a shutdown), it
# writes instead, if it has the time:
#   stopped <attempt> <incarnation> <unix ns>
# It fails every attempt of a task named doomed-*, and the first attempt of
# a job whose id starts with 0-4 (5 of 16 hex digits: 31 %).
tag=$1
rec=$2/$ORCH_JOB_ID
trap 'echo "stopped $ORCH_ATTEMPT $tag $(date +%s%N)" >>"$rec"; exit 143' TERM
echo "start $ORCH_ATTEMPT $tag $(date +%s%N)" >>"$rec"
code=0
case "$ORCH_TASK" in
doomed-*) code=1 ;;
*) case "$ORCH_ATTEMPT:$ORCH_JOB_ID" in 1:[0-4]*) code=1 ;; esac ;;
esac
# 10 to 99 ms of "work", so that runs overlap and a kill finds some running.
sleep "$(printf '0.%03d' $(($$ % 90 + 10)))"
echo "end $ORCH_ATTEMPT $tag $code $(date +%s%N)" >>"$rec"
exit $code
