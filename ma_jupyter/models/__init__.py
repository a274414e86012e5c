"""The wire model: the single source of truth for a job.

Everything that describes a job travels as one of these pydantic models: the REST API, the
client, the magics, the widgets, the CLI and the TypeScript types of the labextension (generated
from :func:`json_schemas`).  Unknown fields are rejected everywhere, so a typo in a field name
is an error and never a silently ignored setting.

The field rules follow the platform's task-style training job: a regular job has one algorithm
and one command, a batch job one algorithm and command per task with outputs in
``<name>-<N>/``; fault restart and checkpoint resume exclude each other; a node name excludes a
driver version and a dedicated pool; the parameter-server count belongs to TensorFlow only and
0 means AllReduce.

The package holds one module per concern, and this module re-exports every name of them, so
``from ma_jupyter.models import JobSpec`` is the one way in:

- ``common``: the base model (:class:`Strict`), the clock, the name pattern and the size bounds;
- ``ids``: the shapes of job ids and node names, and the check of a target a front end got;
- ``users``: users, their name patterns and notification settings;
- ``spec``: :class:`JobSpec` and its parts, and :func:`parse_spec`;
- ``images``: registered images;
- ``cluster``: specs, nodes and the cluster view;
- ``jobs``: a job, its nodes, a batch job's tasks, its events;
- ``logs``: log streams and chunks;
- ``kernel``: how a dev environment's kernel is reached;
- ``listing``: a job listing's summaries and pages;
- ``plans``: the resolved launch plan;
- ``algorithms``, ``caches``, ``samples``: a user's algorithm folders, the caches and prepared
  data, a job's resource samples;
- ``schemas``: the JSON schemas the TypeScript types are generated from.
"""

from __future__ import annotations

# The wire's plain parts (names, enumerations, durations) live in wire.py, which needs no
# pydantic: a command line reads answers through them without importing this package.
from ..wire import (
    API_PREFIX,
    FORWARDED_USER_HEADER,
    MAX_DURATION,
    OBJECT_SCHEMES,
    TERMINAL_STATUSES,
    TRANSITIONS,
    Access,
    Convention,
    DatasetSource,
    HangPolicy,
    JobSort,
    JobStatus,
    JobType,
    Mode,
    ModelSource,
    PerfPolicy,
    Priority,
    clone_name,
    is_object_uri,
    parse_duration,
)
from .algorithms import (
    Algorithm,
    AlgorithmVersion,
    FavouriteAlgorithm,
)
from .caches import (
    CacheInfo,
    PreparedData,
)
from .cluster import (
    ClusterNode,
    ClusterView,
    Node,
    NodeDrain,
    QueuedJob,
    Spec,
    SpecRoom,
)
from .common import (
    DIGEST_PATTERN,
    MAX_COMMAND,
    MAX_ENV,
    MAX_MOUNTS,
    MAX_PATH,
    MAX_SHORT,
    MAX_SPECS,
    MAX_TASKS,
    NAME_PATTERN,
    NO_NUL,
    Command,
    Digest,
    Path_,
    Short,
    Strict,
    utcnow,
)
from .ids import (
    JOB_ID_PATTERN,
    NODE_NAME_PATTERN,
    check_node_target,
)
from .images import (
    ImageCardType,
    ImageScope,
    RegisteredImage,
)
from .jobs import (
    Event,
    Job,
    NodeRun,
    TaskState,
    task_states,
)
from .kernel import (
    KernelRelay,
    KernelRoute,
)
from .listing import (
    SUMMARY_FAILED_TASKS,
    SUMMARY_REASON_CHARS,
    SUMMARY_SPEC_FIELDS,
    JobPage,
    JobSpecSummary,
    JobSummary,
)
from .logs import (
    LogChunk,
    LogFile,
    LogStream,
)
from .plans import (
    ImageInfo,
    Mount,
    NodeLaunch,
    Plan,
    RunAs,
)
from .samples import (
    NodeLimits,
    ResourceSample,
    ResourceUsage,
)
from .schemas import (
    json_schemas,
)
from .spec import (
    SECRET_MASK,
    SECRET_PREFIX,
    AnnotationMount,
    BatchTask,
    CheckpointResume,
    DatasetMount,
    DevEnvOrigin,
    EnvName,
    EnvValue,
    FaultRestart,
    Image,
    JobSpec,
    Lifecycle,
    ModelMount,
    VolumeMount,
    describe_validation_error,
    parse_spec,
)
from .users import (
    ANY_USER_PATTERN,
    FORWARDED_PREFIX,
    USER_PATTERN,
    NewUser,
    NotifySettings,
    User,
    UserToken,
)

__all__ = [
    "ANY_USER_PATTERN",
    "API_PREFIX",
    "Access",
    "Algorithm",
    "AlgorithmVersion",
    "AnnotationMount",
    "BatchTask",
    "CacheInfo",
    "CheckpointResume",
    "ClusterNode",
    "ClusterView",
    "Command",
    "Convention",
    "DIGEST_PATTERN",
    "DatasetMount",
    "DatasetSource",
    "DevEnvOrigin",
    "Digest",
    "EnvName",
    "EnvValue",
    "Event",
    "FORWARDED_PREFIX",
    "FORWARDED_USER_HEADER",
    "FaultRestart",
    "FavouriteAlgorithm",
    "HangPolicy",
    "Image",
    "ImageCardType",
    "ImageInfo",
    "ImageScope",
    "JOB_ID_PATTERN",
    "Job",
    "JobPage",
    "JobSort",
    "JobSpec",
    "JobSpecSummary",
    "JobStatus",
    "JobSummary",
    "JobType",
    "KernelRelay",
    "KernelRoute",
    "Lifecycle",
    "LogChunk",
    "LogFile",
    "LogStream",
    "MAX_COMMAND",
    "MAX_DURATION",
    "MAX_ENV",
    "MAX_MOUNTS",
    "MAX_PATH",
    "MAX_SHORT",
    "MAX_SPECS",
    "MAX_TASKS",
    "Mode",
    "ModelMount",
    "ModelSource",
    "Mount",
    "NAME_PATTERN",
    "NODE_NAME_PATTERN",
    "NO_NUL",
    "NewUser",
    "Node",
    "NodeDrain",
    "NodeLaunch",
    "NodeLimits",
    "NodeRun",
    "NotifySettings",
    "OBJECT_SCHEMES",
    "Path_",
    "PerfPolicy",
    "Plan",
    "PreparedData",
    "Priority",
    "QueuedJob",
    "RegisteredImage",
    "ResourceSample",
    "ResourceUsage",
    "RunAs",
    "SECRET_MASK",
    "SECRET_PREFIX",
    "SUMMARY_FAILED_TASKS",
    "SUMMARY_REASON_CHARS",
    "SUMMARY_SPEC_FIELDS",
    "Short",
    "Spec",
    "SpecRoom",
    "Strict",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "TaskState",
    "USER_PATTERN",
    "User",
    "UserToken",
    "VolumeMount",
    "check_node_target",
    "clone_name",
    "describe_validation_error",
    "is_object_uri",
    "json_schemas",
    "parse_duration",
    "parse_spec",
    "task_states",
    "utcnow",
]
