"""The ``rag-mag`` command line: one module per subcommand, each with ``add_parser`` and ``run``."""

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" suffix, but only where there is a default to state and the help text does
    not state it already (no "(default: None)", no "(default: 200) (default: 200)")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if action.default is None or action.default is argparse.SUPPRESS or "default" in help_text:
            return help_text
        return super()._get_help_string(action)
