"""The signer as an Azure Function (Python v2 programming model): ``POST /api/sign`` with a function
key; the logic is :mod:`signer` (see there for why it exists)."""

from __future__ import annotations

import json
import os

import azure.functions as func
from signer import handle

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)


@app.route(route="sign", methods=["POST"])
def sign_decision(req: func.HttpRequest) -> func.HttpResponse:
    status, answer = handle(req.get_body(), os.environ)
    return func.HttpResponse(json.dumps(answer), status_code=status, mimetype="application/json")
