"""Decisions as the approver reads them (issue 23 items 8-10): RFC 8785's own number vectors for the
canonical form a signature covers, I-JSON (no repeated member), a lifetime that ends after it
begins."""

from __future__ import annotations

import json
import struct
import time

import pytest

from bridge.decisions import (
    Decision,
    DecisionRefused,
    ValidationPolicy,
    canonical,
    loads_strict,
    new_decision,
    sign,
    validate,
)
from bridge.signing import KeyRing

KEY = b"k" * 40
POLICY = ValidationPolicy(KeyRing({"ops": KEY}))
EVENT = "28957A56-C52D-5E12-BC58-57EBD6129DEF"

# RFC 8785 Appendix B, "Number Serialization Samples": IEEE 754 bits -> the JSON text (finite ones).
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("bits", "text"), APPENDIX_B)
def test_numbers_are_canonical_as_rfc_8785_prints_them(bits: str, text: str) -> None:
    (value,) = struct.unpack(">d", bytes.fromhex(bits))
    assert canonical({"n": value}) == b'{"n":' + text.encode() + b"}"


def test_the_canonical_form_sorts_keys_by_utf16_code_units_and_drops_the_signature() -> None:
    # RFC 8785 section 3.2.3's sorting example (a key sorts by its UTF-16 code units, not by code point).
    keys = dict.fromkeys(["\u20ac", "\r", "\ufb33", "1", "\U0001f600", "\u0080", "\u00f6"], "")
    order = [key for key, _ in json.loads(canonical(keys), object_pairs_hook=list)]
    assert order == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert canonical({"b": 1.0, "a": "x", "signature": {"value": "y"}}) == b'{"a":"x","b":1}'


def test_a_signature_over_rfc_8785_verifies_whatever_the_number_spelling() -> None:
    """``schemaVersion: 1.0`` is the schema's 1; signed by an RFC 8785 signer (``1``), it verifies."""
    decision = sign({**new_decision(EVENT, "vm1", "ops", 600), "schemaVersion": 1.0}, "ops", KEY)
    assert validate(decision, POLICY, time.time()) == Decision.of(decision)


def test_a_repeated_member_is_not_i_json() -> None:
    """A first-wins and a last-wins reader would see two decisions under one signature."""
    with pytest.raises(ValueError, match="'target' appears twice"):
        loads_strict(b'{"target": "vm1", "decisionId": "d-00000001", "target": "vm2"}')
    with pytest.raises(ValueError, match="'a' appears twice"):
        loads_strict(b'{"x": {"a": 1, "a": 2}}')
    assert loads_strict(b'{"a": {"a": 1}}') == {"a": {"a": 1}}


def test_a_decision_that_expires_before_it_is_issued_is_refused() -> None:
    now = time.time()
    decision = new_decision(EVENT, "vm1", "ops", 600, now=now)
    backwards = sign(
        {**decision, "issuedAt": decision["expiresAt"], "expiresAt": decision["issuedAt"]}, "ops", KEY
    )
    with pytest.raises(DecisionRefused) as refused:
        validate(backwards, POLICY, now)
    assert (refused.value.reason, refused.value.authentic) == ("schema", True)
    unsigned = {**decision, "issuedAt": decision["expiresAt"]}
    with pytest.raises(DecisionRefused) as refused:
        validate(unsigned, POLICY, now)
    assert (refused.value.reason, refused.value.authentic) == ("unsigned", False)


def test_public_keys_are_read_without_the_crypto_library_and_only_ed25519(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 31: agents hold public keys only; reading one must not import PyCA (7 MiB of RSS on
    every VM), and a PEM of another algorithm, or garbage, is refused at start, not at the first
    decision."""
    import subprocess
    import sys

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from bridge.decisions import DecisionKeys, PublicKey, generate_key_pair, parse_key

    _, public = generate_key_pair()
    (tmp_path / "ops.pub").write_bytes(public)
    code = (
        "import sys; from bridge.decisions import DecisionKeys; "
        f"DecisionKeys.from_specs(['ops={tmp_path / 'ops.pub'}'], public_only=True); "
        "print('cryptography' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    key = parse_key(public, "ops.pub")
    assert isinstance(key, PublicKey) and len(key.raw) == 32
    other = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ValueError, match="not Ed25519"):
        parse_key(other, "ec.pub")
    with pytest.raises(ValueError, match="not a readable PEM"):
        parse_key(b"-----BEGIN PUBLIC KEY-----\n%%%\n-----END PUBLIC KEY-----", "bad.pub")
    private = Ed25519PrivateKey.generate()
    keys = DecisionKeys(
        {
            "ops": parse_key(
                private.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                ),
                "k",
            )
        }
    )  # type: ignore[dict-item]
    assert keys.ids() == ["ops"]
