"""The client's calls that take a job elsewhere: its export to another platform, a debug
terminal into a running node, the job as a notebook and a dev environment of one of its nodes
with the route to its kernel.

A mixin of :class:`~ma_jupyter.client.Client` over its :class:`~.session.ServiceSession`;
every method is documented as ``Client``'s.
"""

from __future__ import annotations

from pathlib import Path

from ..wire import API_PREFIX
from .handle import JobHandle
from .session import IDEMPOTENCY_HEADER, ServiceSession, new_key, segment

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..models import JobSpec, KernelRoute
    from .shell import ShellSession


class DevToolCalls(ServiceSession):
    """Exports, debug terminals and dev environments (``/jobs/{id}/export``, ``/export``,
    ``/jobs/{id}/shell``, ``/jobs/{id}/devenv``, ``/jobs/{id}/kernel``)."""

    def export(
        self, job_id: str, format: str = "k8s", *, image: str | None = None, mounts_as: str | None = None
    ) -> str:
        """What job ``job_id`` would be on another platform, as that platform's text.

        Args:
            job_id: the job (yours, or another user's you may view).
            format: ``k8s``: Kubernetes manifests, multi-document YAML for ``kubectl apply -f``
                (an Indexed Job per role, a headless Service; :mod:`ma_jupyter.export.k8s`).
            image: the container image (default: one for the job's mode).
            mounts_as: ``pvc`` (claims standing for the host folders, the default) or
                ``hostpath`` (the host folders themselves).

        Raises:
            InvalidSpec: an unknown format (the message names the known ones), or a job the
                format cannot express (it says why).
            NotFound: no such job (or it is hidden from this user).
        """
        params = {"format": format, "image": image, "mounts_as": mounts_as}
        return self._request("GET", f"/jobs/{segment(job_id)}/export", params=params, text=True)

    def export_spec(
        self,
        spec: JobSpec | dict[str, Any] | None = None,
        format: str = "k8s",
        *,
        image: str | None = None,
        mounts_as: str | None = None,
        **fields: Any,
    ) -> str:
        """What a job would be on another platform, without submitting it (``--dry-run --format``).

        Args:
            spec, **fields: as for :meth:`submit`; a command naming a file of the current folder
                without ``algorithm`` gets this folder as its ``/workspace/algorithm``, as a
                submit would ship it (nothing is copied).
            format, image, mounts_as: as for :meth:`export`.

        Raises:
            InvalidSpec: as for :meth:`submit` and :meth:`export`.
        """
        body = self._spec_body(spec, fields)
        from .snapshot import names_local_file

        if not body.get("algorithm") and names_local_file(body.get("command"), Path.cwd()):
            body["algorithm"] = str(Path.cwd())
        params = {"format": format, "image": image, "mounts_as": mounts_as}
        return self._request("POST", "/export", params=params, json_body=body, text=True)

    def shell(
        self,
        job_id: str,
        node: str | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        command: Sequence[str] | None = None,
    ) -> ShellSession:
        """Open the debug terminal of a node of a running job submitted with ``debug_terminal``:
        an interactive shell inside the node's sandbox, or ``command`` run on that terminal.

        Args:
            node: the node (default: the job's first).

        The service's refusals (no debug terminal, job not running, another user's job) come
        from the session's first :meth:`ShellSession.receive`.
        """
        import json
        from urllib.parse import urlencode

        self.connect()
        query = {"rows": rows, "cols": cols}
        if node:
            query["node"] = node
        if command:
            query["command"] = json.dumps(list(command))
        url = f"{self._url}{API_PREFIX}/jobs/{segment(job_id)}/shell?{urlencode(query)}"
        from .shell import open_session  # the debug terminal's protocol: only `shell` needs it

        return open_session(url, self.auth_headers(), self.timeout)

    def devenv(self, job_id: str) -> dict[str, Any]:
        """The job as a notebook whose code cell submits it again (the seed's "create a
        development environment from a job"): ``{"name": "<job name>-devenv.ipynb", "notebook":
        <nbformat 4 JSON>}``; see :mod:`ma_jupyter.export.notebook` for what the cells hold.

        Needs view access to the job, as cloning does.
        """
        return self._request("GET", f"/jobs/{segment(job_id)}/devenv")

    def create_devenv(self, job_id: str, node: str | int | None = None) -> JobHandle:
        """Start a dev environment of one of the job's nodes (default its first): a job of this
        client's user with that node's sandbox and a Jupyter kernel as its command
        (``POST /jobs/{id}/devenv``; only the job's owner or an admin may).  Attach a notebook
        with the kernelspec :func:`ma_jupyter.client.kernelspec.install_devenv_kernel` installs."""
        body = {} if node is None else {"node": node}
        data = self._request(
            "POST",
            f"/jobs/{segment(job_id)}/devenv",
            json_body=body,
            headers={IDEMPOTENCY_HEADER: new_key()},
        )
        return JobHandle(self, self._answer("Job", data))

    def kernel_route(self, devenv_id: str) -> KernelRoute:
        """How to reach the kernel of the running dev environment ``devenv_id`` (``POST
        /jobs/{id}/kernel``; its owner or an admin): its kernel folder on the service's machine,
        or the relay on the Ray node that runs it, with the relay's secret."""
        return self._answer("KernelRoute", self._request("POST", f"/jobs/{segment(devenv_id)}/kernel"))
