"""S3 list_uploads reads every page of ListMultipartUploads, not only the first 1,000 uploads.

moto answers every upload in one page whatever MaxUploads says, so this runs against
``rclone serve s3``, which pages as S3 does (1,000 a page, KeyMarker/UploadIdMarker)."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from bridge import stores
from bridge.urls import parse
from tests.emulators import EmulatorError, RcloneS3
from tests.helpers import settings_for


class ManyUploadsRcloneS3(RcloneS3):
    def command(self) -> list[str]:
        return [*super().command(), "--multipart-max-uploads", "0"]  # its default refuses past 1,000


@pytest.fixture(scope="module")
def rclone_s3():
    try:
        with ManyUploadsRcloneS3() as server:
            yield server
    except EmulatorError as exc:
        pytest.skip(str(exc))


def test_list_uploads_reads_past_the_first_page(rclone_s3):
    client = rclone_s3.client()
    client.create_bucket(Bucket="many-uploads")
    count = 1234
    with cf.ThreadPoolExecutor(4) as pool:
        made = set(pool.map(lambda i: (f"ckpt/{i % 50:02d}.bin",
                                       client.create_multipart_upload(Bucket="many-uploads",
                                                                      Key=f"ckpt/{i % 50:02d}.bin")["UploadId"]),
                            range(count)))
    first = client.list_multipart_uploads(Bucket="many-uploads", Prefix="ckpt/")
    assert first["IsTruncated"] and len(first["Uploads"]) < count, "the endpoint must page for this test"

    store = stores.get_store("s3", settings_for(rclone_s3.env()))
    listed = [(loc.key, upload_id) for loc, upload_id in store.list_uploads(parse("s3://many-uploads/ckpt/"))]
    assert len(listed) == count and set(listed) == made
