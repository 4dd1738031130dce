"""`--chat-template PATH_OR_STRING`: a Jinja chat template that replaces the model's own, read and checked
once at start-up (before the model loads)."""

from __future__ import annotations

from pathlib import Path

JINJA_MARKERS = ("{{", "{%")


def load_chat_template(value: str) -> str:
    """The template's source: the file `value` names, else `value` itself when it is Jinja; a ValueError
    (with the reason) for a missing file, an unreadable one, or a template Jinja cannot parse."""
    import jinja2

    path = Path(value).expanduser()
    if path.is_file():
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--chat-template: cannot read {str(path)!r}: {e}") from None
    elif any(marker in value for marker in JINJA_MARKERS):
        source = value
    else:
        raise ValueError(f"--chat-template: {value!r} is no file, and holds no Jinja ('{{{{' or '{{%'): "
                         "give a template file or the template itself")
    try:
        jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"--chat-template: the template does not parse (line {e.lineno}): {e.message}") from None
    return source
