// Loads a Chrome trace-event JSON file with Chrome DevTools' own trace engine (the performance
// panel's: @paulirish/trace_engine) and prints what it made of it as JSON: each process's threads,
// their names and the calls on them, the flows, the trace's bounds. Used by tests/test_trace.py.
import {analyzeTrace} from '@paulirish/trace_engine/analyze-trace.mjs';

const {parsedTrace} = await analyzeTrace(process.argv[2]);
const data = parsedTrace.data;
const processes = {};
for (const [pid, proc] of data.Renderer.processes) {
  const threads = {};
  for (const [tid, thread] of proc.threads) {
    threads[tid] = {name: thread.name ?? null,
                    entries: thread.entries.map(e => ({name: e.name, ts: e.ts, dur: e.dur ?? 0, args: e.args ?? {}}))};
  }
  processes[pid] = {threads};
}
const names = {};
for (const event of parsedTrace.traceEvents ?? []) {
  if (event.ph === 'M' && event.name === 'process_name') names[event.pid] = event.args.name;
}
console.log(JSON.stringify({processes, names, flows: data.Flows.flows.length, bounds: data.Meta.traceBounds}));
