"""`python -m services.locks`: run the locks service until SIGINT/SIGTERM."""

from services.common.grpc_server import run_service
from services.locks.app import build_app
from services.locks.settings import LocksSettings

if __name__ == "__main__":
    run_service("locks", LocksSettings, build_app)
