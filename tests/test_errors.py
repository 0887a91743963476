"""Every MediaError is safe to send to the client (what was wrong with the request) and carries
the operator's hint (which setting would change the outcome) apart from it."""

import ast
import pickle
import re
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

import lazymedia
from lazymedia import synthetic
from lazymedia.errors import MediaError, MediaTooLargeError, upstream_status_error

PACKAGE = Path(lazymedia.__file__).parent
# What only an operator can act on: a setting's name, or advice to change one.
OPERATOR_WORDS = re.compile(
    r"Limits\(|Limits\.|MediaConnector\(|allow_private_networks|allowed_local_path|"
    r"allow_redirects|allowed_domains|max_redirects|timeout_s|max_bytes|raise the limit|"
    r"LAZYMEDIA_|pip install|release_bytes\(|pass [\w.]+[=(]"
)
ERROR_NAMES = {name for name in dir(lazymedia.errors) if name.endswith("Error")} | {"_RefusedAddress"}


def _message_text(node: ast.expr) -> str:
    """The literal text of a message expression (f-string parts, concatenations)."""
    return "".join(
        part.value for part in ast.walk(node) if isinstance(part, ast.Constant) and isinstance(part.value, str)
    )


def test_no_raise_site_puts_operator_advice_in_the_client_message():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args and getattr(node.func, "id", None) in ERROR_NAMES:
                text = _message_text(node.args[0])
                if OPERATOR_WORDS.search(text):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text[:100]}")
    assert not found, "operator advice in client messages (move it to hint=):\n" + "\n".join(found)


def test_a_limit_error_tells_the_client_what_and_the_operator_which_setting():
    with pytest.raises(MediaTooLargeError) as info:
        lazymedia.load_image(synthetic.jpeg(), limits=lazymedia.Limits(max_bytes=100))
    exc = info.value
    assert exc.status_code == 413 and "100-byte limit" in str(exc) and "Limits" not in str(exc)
    assert exc.hint == "raise Limits.max_bytes"
    assert exc.operator_message == f"{exc} [operator: raise Limits.max_bytes]"


def test_a_refused_private_address_keeps_the_setting_out_of_the_client_message():
    with pytest.raises(lazymedia.InvalidMediaError) as info:
        lazymedia.MediaConnector().fetch_sync("image", "http://127.0.0.1/x.jpg")
    assert "not a public address" in str(info.value) and "allow_private_networks" not in str(info.value)
    assert "allow_private_networks" in info.value.hint


def test_the_hint_survives_pickling_and_indexing():
    exc = MediaTooLargeError("too big", hint="raise Limits.max_pixels", modality="image")
    back = pickle.loads(pickle.dumps(exc.with_index(3)))
    assert (str(back), back.hint, back.status_code) == ("item 3 image: too big", "raise Limits.max_pixels", 413)
    assert MediaError("bad").operator_message == "bad"


@pytest.mark.parametrize(
    "status, expected",
    [(404, 400), (403, 400), (410, 400), (400, 400), (408, 504), (429, 502), (500, 502), (503, 502), (204, 502)],
)
def test_an_upstream_status_maps_to_what_the_client_can_do(status, expected):
    exc = upstream_status_error("media.example", status, "Reason")
    assert exc.status_code == expected and f"answered {status} Reason" in str(exc)
    assert ("retry later" in str(exc)) == (expected != 400)


def test_client_text_names_no_object_of_the_servers_memory():
    from lazymedia.errors import described

    text = described(OSError("cannot identify image file <_io.BytesIO object at 0x7f9974957a00>"))
    assert text == "OSError: cannot identify image file" and "0x" not in text
    assert described(ValueError("plain")) == "ValueError: plain"


def test_a_traceback_shows_the_hint_and_the_client_message_does_not():
    """A str path fails with "media source is a str"; the fix (pathlib.Path) is in the hint, which an
    uncaught traceback shows as a PEP 678 note."""
    with pytest.raises(lazymedia.InvalidMediaError) as info:
        lazymedia.load_image("photo.jpg")
    assert "pathlib.Path" not in str(info.value)
    shown = "".join(traceback.format_exception(info.value))
    assert "media source is a str" in shown and "hint: pass the encoded bytes, a pathlib.Path" in shown, shown
    indexed = pickle.loads(pickle.dumps(info.value.with_index(3)))
    assert indexed.__notes__ == [f"hint: {info.value.hint}"]  # once, after a copy and a pickle
    uncaught = subprocess.run(
        [sys.executable, "-c", "import lazymedia; lazymedia.load_image('photo.jpg')"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert uncaught.returncode == 1 and "hint: pass the encoded bytes, a pathlib.Path" in uncaught.stderr
