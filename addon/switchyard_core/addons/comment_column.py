"""mitmweb's flow list says what failed at a glance: its Comment column, on.

Switchyard writes why into each flow's comment (the client's flow: which upstream
failed how and who answered; each attempt's flow: its failure and what came of
it), and marks them; mitmweb shows comments only in a column that is off by
default.  Where the columns are mitmweb's defaults, Switchyard adds that column
at the end; where the user chose them (`web_columns`), it leaves them alone.
"""

from __future__ import annotations

import logging

from mitmproxy import ctx

from .. import observe

OPTION = "web_columns"  # mitmweb's; mitmdump and the console have no such option
COLUMN = "comment"


class CommentColumn:
    def running(self) -> None:
        options = ctx.options
        if OPTION not in options or options.has_changed(OPTION):
            return
        columns = list(getattr(options, OPTION))
        if COLUMN not in columns:
            options.update(**{OPTION: [*columns, COLUMN]})
            observe.emit(logging.DEBUG, "switchyard.web_columns", added=COLUMN,
                         note="set web_columns to choose the columns yourself")
