-- wrk -s post.lua: POST a ~100-byte UnifiedPush body to one topic.
wrk.method = "POST"
wrk.body = string.rep("x", 100)
wrk.headers["Content-Type"] = "application/octet-stream"
