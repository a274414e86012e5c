/**
 * The sidebar's calls to the server extension (`<base_url>/ma-jupyter/api/...`), which forwards
 * them to the job service. Every answer is the JSON of the wire model (see models.ts); an error
 * answer carries `{error, message, field}` and becomes an ApiError.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type {
  Event,
  Job,
  JobPage,
  JobSpec,
  JobStatus,
  LogChunk,
  LogStream,
  Node,
  Plan,
  Spec
} from './models';

/** A failed call: the service's error kind, its message (which says what to do) and field. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly kind: string,
    message: string,
    readonly field: string | null = null
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** Where the job service runs, as the server extension sees it. */
export interface ServiceStatus {
  running: boolean;
  home: string;
  log: string;
  url: string | null;
  pid: number | null;
  version: string | null;
}

/** Filters of the job list. */
export interface JobQuery {
  name?: string;
  status?: JobStatus[];
  offset?: number;
  limit?: number;
}

type Params = Record<string, string | number | boolean | null | undefined | Array<string>>;

function query(params: Params): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === '') {
      continue;
    }
    if (Array.isArray(value)) {
      value.forEach(v => search.append(key, v));
    } else {
      search.append(key, String(value));
    }
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

/** One call to the server extension; JSON in and out, ApiError on failure. */
export async function requestAPI<T>(
  endpoint: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'ma-jupyter', 'api', endpoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(0, 'network', `Jupyter server unreachable: ${String(error)}`);
  }
  if (response.status === 204) {
    return undefined as T;
  }
  const text = await response.text();
  let body: any = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = { message: text.slice(0, 300) };
    }
  }
  if (!response.ok) {
    throw new ApiError(
      response.status,
      body?.error ?? 'error',
      body?.message ?? `HTTP ${response.status} from ${endpoint}`,
      body?.field ?? null
    );
  }
  return body as T;
}

function send(method: string, body?: unknown, signal?: AbortSignal): RequestInit {
  const init: RequestInit = { method, signal };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { 'Content-Type': 'application/json' };
  }
  return init;
}

const job = (id: string, rest = ''): string => `jobs/${encodeURIComponent(id)}${rest}`;

/** The REST calls the sidebar makes, one function per route. */
export const api = {
  service: (): Promise<ServiceStatus> => requestAPI<ServiceStatus>('service'),
  jobs: (q: JobQuery = {}): Promise<JobPage> =>
    requestAPI<JobPage>(
      'jobs' +
        query({ name: q.name, status: q.status, offset: q.offset, limit: q.limit })
    ),
  job: (id: string): Promise<Job> => requestAPI<Job>(job(id)),
  submit: (spec: Partial<JobSpec>): Promise<Job> =>
    requestAPI<Job>('jobs', send('POST', spec)),
  plan: (spec: Partial<JobSpec>): Promise<Plan> =>
    requestAPI<Plan>('plan', send('POST', spec)),
  stop: (id: string): Promise<Job> => requestAPI<Job>(job(id, '/stop'), send('POST')),
  remove: (id: string, force = false): Promise<void> =>
    requestAPI<void>(job(id) + query({ force: force ? 'true' : undefined }), send('DELETE')),
  events: (id: string, after = 0): Promise<Event[]> =>
    requestAPI<Event[]>(job(id, '/events') + query({ after })),
  logStreams: (id: string): Promise<LogStream[]> => requestAPI<LogStream[]>(job(id, '/logs')),
  readLog: (
    id: string,
    stream: { node?: string | null; rank?: number | null },
    offset: number,
    wait: number,
    signal?: AbortSignal
  ): Promise<LogChunk> =>
    requestAPI<LogChunk>(
      job(id, '/logs/read') +
        query({ node: stream.node, rank: stream.rank, offset, wait }),
      send('GET', undefined, signal)
    ),
  /** Start (or reuse) the job's TensorBoard; `url` is its address through the Jupyter server. */
  tensorboard: (id: string): Promise<{ url: string; direct_url: string }> =>
    requestAPI<{ url: string; direct_url: string }>(job(id, '/tensorboard'), send('POST')),
  specs: (): Promise<Spec[]> => requestAPI<Spec[]>('specs'),
  nodes: (spec?: string): Promise<Node[]> => requestAPI<Node[]>('nodes' + query({ spec }))
};
