"""The CLI's live alert lines (frontends/cli/output.py's ``Alerts``): a look during a follow that
fails ends nothing; the same failure after the follow is said."""

from __future__ import annotations

import pytest

from ma_jupyter.errors import BackendUnavailable, NotFound
from ma_jupyter.frontends.cli.output import Alerts


class GoneJob:
    """A job handle whose events can no longer be read (the job was deleted meanwhile)."""

    def __init__(self, error):
        self.error = error

    def events(self, after=0):
        raise self.error


@pytest.mark.parametrize("error", [NotFound("job j-1 not found"), BackendUnavailable("restarting")])
def test_a_look_during_a_follow_that_fails_ends_nothing(error, capsys):
    alerts = Alerts(GoneJob(error))
    alerts.show_new(quiet_if_unavailable=True)  # during the follow: nothing said, nothing raised
    assert capsys.readouterr().err == ""
    with pytest.raises(type(error)):
        alerts.show_new()  # at the end: the caller says it
