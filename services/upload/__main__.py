"""`python -m services.upload`: run the upload service until SIGINT/SIGTERM."""

from services.common.grpc_server import run_service
from services.upload.app import build_app
from services.upload.settings import UploadSettings

if __name__ == "__main__":
    run_service("upload", UploadSettings, build_app)
