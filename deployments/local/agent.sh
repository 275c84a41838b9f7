#!/bin/sh
# A harmless stand-in for the agent CLI, used by `make run`: it shows what
# a real agent is given (its environment and the task on stdin), then exits
# with $ORCH_STANDIN_EXIT (0 unless set).
echo "stand-in agent: job $ORCH_JOB_ID attempt $ORCH_ATTEMPT ($ORCH_KIND of $ORCH_PROJECT/$ORCH_TASK) in $(pwd)"
echo "task file: $ORCH_TASK_FILE"
cat
sleep "${ORCH_STANDIN_SLEEP:-1}"
exit "${ORCH_STANDIN_EXIT:-0}"
