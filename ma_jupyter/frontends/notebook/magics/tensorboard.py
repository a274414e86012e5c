"""``%ma_tensorboard``: a job's TensorBoard in an IFrame, or its scalars as a PNG."""

from __future__ import annotations

from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from .parsing import job_parser, parse, resolve_job

if TYPE_CHECKING:
    from IPython.core.magic import Magics


def ma_tensorboard(magics: Magics, line: str):
    """TensorBoard over a job's outputs: ``%ma_tensorboard JOB [--inline] [--height PX]``.

    Shows the job's TensorBoard in an IFrame; ``--inline`` draws the job's scalars as a PNG
    instead (kept in the saved notebook).
    """
    from ..session import get_client

    parser = job_parser("%ma_tensorboard", "Open a job's TensorBoard, or plot its scalars inline.")
    parser.add_argument("--inline", action="store_true", help="plot the scalars as a PNG (no server)")
    parser.add_argument("--height", type=int, default=600, help="IFrame height in pixels")
    parser.add_argument("--stop", action="store_true", help="stop the job's TensorBoard")
    parser.add_argument(
        "--via-jupyter",
        nargs="?",
        const="/",
        metavar="BASE_URL",
        help="show it through the Jupyter server's proxy (<BASE_URL>ma-jupyter/tensorboard/<job>/, "
        "default base /), for a browser that reaches only the Jupyter server",
    )
    args = parse(parser, line)
    if args is None:
        return None
    from IPython.display import IFrame, display

    client = get_client()
    handle = resolve_job(client, args.job)
    if args.stop:
        client.stop_tensorboard(handle.id)
        print(f"TensorBoard of job {handle.id} stopped")
        return None
    if args.inline:
        from ..scalars import scalars_png

        outputs = handle.info.outputs_folder or handle.info.spec.outputs
        if not outputs:  # a job of an older service, without the default folder recorded
            raise UsageError(f"job {handle.id} has no outputs folder (--output): nothing to plot")
        png = scalars_png(outputs, title=f"{handle.name} ({handle.id})")
        display({"image/png": png, "text/plain": f"scalars of job {handle.id}"}, raw=True)
        return None
    url = client.tensorboard(handle.id)
    shown = url
    if args.via_jupyter:
        from urllib.parse import quote

        # a path on the page's own server: the browser resolves it against JupyterLab's origin
        shown = f"{args.via_jupyter.rstrip('/')}/ma-jupyter/tensorboard/{quote(handle.id, safe='')}/"
    display(IFrame(shown, width="100%", height=args.height))
    print(f"TensorBoard of job {handle.id}: {shown}")
    return url
