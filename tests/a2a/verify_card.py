"""Checks the signature of an A2A Agent Card with the `a2a-sdk`'s own
verifier (`a2a.utils.signing.create_signature_verifier`), the key taken
from the JWKS its signature's `jku` names:

    python verify_card.py CARD_URL [JWKS_URL]

(JWKS_URL: read the keys there rather than at the `jku`, for a card whose
public URL is not where the test reaches it.) Prints one JSON object:
`verified` (the card as served), `tampered_refused` (the same card with its
description changed is refused), `kid`, `jku`, `alg` and `url` (its
interface's).
Exits 1 if the card cannot be read.
"""

import base64
import json
import sys
import urllib.request

from google.protobuf.json_format import ParseDict
from jwt import PyJWK

from a2a.types import AgentCard
from a2a.utils.signing import SignatureVerificationError, create_signature_verifier


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def main() -> None:
    raw = get(sys.argv[1])
    protected = raw["signatures"][0]["protected"]
    header = json.loads(base64.urlsafe_b64decode(protected + "=" * (-len(protected) % 4)))
    keys = get(sys.argv[2] if len(sys.argv) > 2 else header["jku"])["keys"]

    def key_provider(kid, jku):
        for k in keys:
            if k.get("kid") == kid:
                return PyJWK(k)
        raise SignatureVerificationError(f"no key {kid}")

    verify = create_signature_verifier(key_provider, ["EdDSA", "ES256", "RS256"])
    card = ParseDict(raw, AgentCard())
    out = {"kid": header.get("kid"), "jku": header.get("jku"), "alg": header.get("alg"),
           "url": raw["supportedInterfaces"][0]["url"]}
    try:
        verify(card)
        out["verified"] = True
    except SignatureVerificationError as e:
        out["verified"] = False
        out["error"] = str(e)
    card.description = card.description + " (changed)"
    try:
        verify(card)
        out["tampered_refused"] = False
    except SignatureVerificationError:
        out["tampered_refused"] = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
