"""`python -m services.notify`: run the notify service until SIGINT/SIGTERM."""

from services.common.grpc_server import run_service
from services.notify.app import build_app
from services.notify.settings import NotifySettings

if __name__ == "__main__":
    run_service("notify", NotifySettings, build_app)
