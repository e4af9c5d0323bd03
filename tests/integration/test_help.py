"""`dj-elastic --help` is plain text (argparse prints descriptions as they are: no reST markup)."""

from __future__ import annotations

import argparse

from data_juicer_elastic.cli import build_parser


def test_no_rest_markup_in_any_help_text():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    texts = {"dj-elastic": parser.format_help()} | {name: p.format_help() for name, p in sub.choices.items()}
    assert len(texts) == 11  # dj-elastic and its ten commands
    for name, text in texts.items():
        assert "``" not in text and ":class:" not in text and ":func:" not in text, name
    assert texts["dj-elastic"].splitlines()[2] == "dj-elastic: the lower-level steps of an elastic sharded job."


def test_verbose_is_accepted_before_and_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["-v", "status", "--job-dir", "j"]).verbose
    assert parser.parse_args(["status", "-v", "--job-dir", "j"]).verbose
    assert not getattr(parser.parse_args(["status", "--job-dir", "j"]), "verbose", False)


def test_every_option_of_every_command_says_what_it_does():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    silent = {
        f"{name} {action.option_strings[-1]}"
        for name, command in sub.choices.items()
        for action in command._actions
        if action.option_strings and not action.help  # argparse.SUPPRESS is an internal option, hidden on purpose
    }
    assert silent == set()


def test_dj_elastic_retry_help_says_which_shards_each_option_requeues(tmp_path):
    from tests.integration.conftest import console_script, run

    result = run([console_script("dj-elastic"), "retry", "--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "--all-failed every terminally failed shard" in text
    assert "--shard-id ID [ID ...] these shards (ids as status lists them" in text
