"""The one exception type aotpack raises for problems the user can fix."""


class AotpackError(Exception):
    """A user-facing error: the message names the problem and what to do about it.

    The CLI prints it as ``aotpack: error: <message>`` and exits with status 1,
    without a traceback.
    """
