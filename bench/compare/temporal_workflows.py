"""The Temporal side of bench/compare: a step is an activity, as a
Switchyard task is an agent call and a Restate step a ctx.run."""

from datetime import timedelta

from temporalio import activity, workflow

STEP_TIMEOUT = timedelta(seconds=60)


@activity.defn(name="step")
async def step(text: str) -> str:
    return text


@workflow.defn(name="One", sandboxed=False)
class One:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity("step", text, start_to_close_timeout=STEP_TIMEOUT)


@workflow.defn(name="Chain", sandboxed=False)
class Chain:
    @workflow.run
    async def run(self, text: str) -> str:
        a = await workflow.execute_activity("step", text, start_to_close_timeout=STEP_TIMEOUT)
        b = await workflow.execute_activity("step", a, start_to_close_timeout=STEP_TIMEOUT)
        return await workflow.execute_activity("step", b, start_to_close_timeout=STEP_TIMEOUT)
