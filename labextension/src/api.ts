/**
 * The sidebar's calls to the job service's REST API, through the server extension's
 * authenticated proxy (`<base_url>/ma-jupyter/api/v1/...` is the service's `/api/v1/...`).
 * Every answer is the service's own JSON: the wire models of models.ts (generated from
 * ma_jupyter.models); an error answer carries `{error, message, field}` and becomes an ApiError.
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
  ResourceUsage,
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

/** Where the job service runs, as the server extension sees it (`<base_url>/ma-jupyter/service`). */
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
  creator?: string;
  spec?: string;
  outputs?: string;
  /** a column the service sorts by (`JobSort`), `-` first for descending */
  sort?: string;
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

/** The server extension's routes: `<base_url>/ma-jupyter/...`. */
const NAMESPACE = 'ma-jupyter';
/** The job service's REST API behind the extension's proxy. */
const SERVICE_API = 'api/v1';

/**
 * One call to the server extension (`endpoint` is relative to `<base_url>/ma-jupyter/`);
 * JSON in and out, ApiError on failure.
 */
export async function requestAPI<T>(
  endpoint: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, NAMESPACE, endpoint);
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

/** A route of the job service's REST API (`path` as in the service's `/api/v1/<path>`). */
const service = (path: string): string => `${SERVICE_API}/${path}`;
const job = (id: string, rest = ''): string => service(`jobs/${encodeURIComponent(id)}${rest}`);

/** The job's TensorBoard through the Jupyter server (an absolute path on this server). */
/**
 * The runs the job's TensorBoard found (its `data/runs`, read as the job's account through the
 * proxy): empty while the outputs hold no event files; null when the board could not be asked.
 */
export async function tensorboardRuns(
  id: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<string[] | null> {
  const url = URLExt.join(settings.baseUrl, NAMESPACE, 'tensorboard', encodeURIComponent(id), 'data', 'runs');
  try {
    const response = await ServerConnection.makeRequest(url, {}, settings);
    return response.ok ? ((await response.json()) as string[]) : null;
  } catch {
    return null;
  }
}

export function tensorboardUrl(
  id: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): string {
  const base = URLExt.parse(settings.baseUrl).pathname;
  return URLExt.join(base, NAMESPACE, 'tensorboard', encodeURIComponent(id)) + '/';
}

/** The REST calls the sidebar makes, one function per route. */
export const api = {
  service: (): Promise<ServiceStatus> => requestAPI<ServiceStatus>('service'),
  jobs: (q: JobQuery = {}): Promise<JobPage> =>
    requestAPI<JobPage>(
      service('jobs') +
        query({
          name: q.name,
          status: q.status,
          creator: q.creator,
          spec: q.spec,
          outputs: q.outputs,
          sort: q.sort,
          offset: q.offset,
          limit: q.limit
        })
    ),
  job: (id: string): Promise<Job> => requestAPI<Job>(job(id)),
  submit: (spec: Partial<JobSpec>): Promise<Job> =>
    requestAPI<Job>(service('jobs'), send('POST', spec)),
  plan: (spec: Partial<JobSpec>): Promise<Plan> =>
    requestAPI<Plan>(service('plan'), send('POST', spec)),
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
  /**
   * Start (or reuse) the job's TensorBoard; `url` is its address through the Jupyter server,
   * `direct_url` the board's own loopback address (what the service answers).
   */
  tensorboard: async (id: string): Promise<{ url: string; direct_url: string }> => {
    const started = await requestAPI<{ url: string }>(job(id, '/tensorboard'), send('POST'));
    return { url: tensorboardUrl(id), direct_url: started.url };
  },
  /** Change a queued job's priority and/or a queued or running job's duration (seconds or 30m). */
  update: (
    id: string,
    change: { priority?: string; duration?: string | number }
  ): Promise<Job> => requestAPI<Job>(job(id), send('PATCH', change)),
  /** The job's resource samples (after `since`, a Unix time) and its nodes' limits. */
  resources: (id: string, since?: number): Promise<ResourceUsage> =>
    requestAPI<ResourceUsage>(job(id, '/resources') + query({ since })),
  /** A notebook reproducing the job as a `%%ma_train` cell: `{name, notebook}`. */
  devenv: (id: string): Promise<{ name: string; notebook: any }> =>
    requestAPI<{ name: string; notebook: any }>(job(id, '/devenv')),
  specs: (): Promise<Spec[]> => requestAPI<Spec[]>(service('specs')),
  nodes: (spec?: string): Promise<Node[]> =>
    requestAPI<Node[]>(service('nodes') + query({ spec }))
};
