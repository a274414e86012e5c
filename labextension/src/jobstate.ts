/**
 * What a job's state means to the views: whether it can still change, and its status and
 * elapsed time as every view writes them.
 */
import { span } from './format';
import type { Job, JobSummary } from './models';

const TERMINAL = new Set(['error', 'stopped', 'expired', 'succeeded']);

/** Whether a job's status can change no more. */
export function isTerminal(job: Job | JobSummary): boolean {
  return TERMINAL.has(job.status ?? 'queued');
}

/** The status, with the queue position of a queued job: `queued #3`, `running`. */
export function statusText(job: Job | JobSummary): string {
  const status = job.status ?? 'queued';
  return status === 'queued' && job.queue_position !== null && job.queue_position !== undefined
    ? `queued #${job.queue_position + 1}`
    : status;
}

/** How long the job ran (ended), has run (running), or '' (queued). */
export function elapsed(job: Job | JobSummary): string {
  if (!job.started_at) {
    return '';
  }
  const start = new Date(job.started_at).getTime();
  const end = job.finished_at ? new Date(job.finished_at).getTime() : Date.now();
  return span((end - start) / 1000);
}
