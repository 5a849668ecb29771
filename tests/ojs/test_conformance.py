"""Tests of the OJS conformance runner: its JSONPath subset, templates and matchers, and
whole test cases replayed against a small HTTP server in this process (so a runner that
passed everything, or failed everything, would be caught)."""

import http.server
import json
import threading
import unittest

import conformance as c


class JsonPath(unittest.TestCase):
    doc = {"job": {"id": "j1", "tags": ["a", "b"]}, "jobs": [{"id": "x", "state": "active"}, {"id": "y", "state": "done"}]}

    def test_keys_indexes_stars_and_filters_select_what_they_name(self):
        self.assertEqual(c.select(self.doc, "$.job.id"), "j1")
        self.assertEqual(c.select(self.doc, "$.job.tags[1]"), "b")
        self.assertEqual(c.select(self.doc, "$.jobs[*].id"), ["x", "y"])
        self.assertEqual(c.select(self.doc, "$.jobs[?(@.state=='done')].id"), "y")

    def test_a_path_to_nothing_is_missing_not_none(self):
        self.assertIs(c.select(self.doc, "$.job.nope"), c.MISSING)
        self.assertIs(c.select(self.doc, "$.jobs[5]"), c.MISSING)
        self.assertIs(c.select({"a": None}, "$.a"), None)

    def test_a_malformed_path_is_an_error(self):
        with self.assertRaises(ValueError):
            c.select(self.doc, "job.id")


class Templates(unittest.TestCase):
    def ctx(self):
        resp = c.Response(201, {}, "", {"job": {"id": "j1", "n": 3}, "jobs": [{"id": "q"}]}, 1.0)
        return {"steps": {"step-1": resp}, "captures": {"job_id": "j9"}}

    def test_a_whole_string_template_becomes_the_value_and_text_templates_become_text(self):
        ctx = self.ctx()
        self.assertEqual(c.fill("{{steps.step-1.response.body.job.n}}", ctx), 3)
        self.assertEqual(c.fill("{{steps.step-1.response.body.jobs}}", ctx), [{"id": "q"}])
        self.assertEqual(c.fill_text("/jobs/{{steps.step-1.response.body.job.id}}", ctx), "/jobs/j1")
        self.assertEqual(c.fill("{{steps.step-1.response.body.jobs[0].id}}", ctx), "q")
        self.assertEqual(c.fill("{{captures.job_id}}", ctx), "j9")

    def test_an_unresolvable_template_stays_as_written(self):
        self.assertEqual(c.fill("{{steps.step-7.response.body.id}}", self.ctx()), "{{steps.step-7.response.body.id}}")


class Matchers(unittest.TestCase):
    def ok(self, e, a):
        self.assertIsNone(c.match(e, a), (e, a))

    def bad(self, e, a):
        self.assertIsNotNone(c.match(e, a), (e, a))

    def test_string_matchers(self):
        self.ok("string:uuidv7", "01936f4e-8a2b-7c3d-9e4f-0123456789ab")
        self.bad("string:uuidv7", "01936f4e-8a2b-4c3d-9e4f-0123456789ab")
        self.ok("string:datetime", "2026-11-25T10:00:00.123Z")
        self.bad("string:datetime", "yesterday")
        self.ok("string:nonempty", "x")
        self.bad("string:nonempty", "")
        self.ok("string:contains:max_attempts", "bad max_attempts value")
        self.ok("string:pattern(^ab)", "abc")

    def test_numbers_arrays_and_approximations(self):
        self.ok("number:range(400,422)", 404)
        self.bad("number:range(400,422)", 500)
        self.ok("~1000", 1400)
        self.ok("~100", 190)
        self.bad("~1000", 1600)
        self.ok("array:length:1", [1])
        self.ok("array:length(0)", [])
        self.bad("array:min_length:2", [1])
        self.bad("array:nonempty", [])

    def test_literals_compare_by_type(self):
        self.ok(1, 1)
        self.bad(1, True)
        self.bad(False, 0)
        self.bad("available", "active")
        self.ok(None, None)
        self.bad(None, c.MISSING)

    def test_operators(self):
        self.ok({"$exists": True, "$type": "string"}, "x")
        self.bad({"$exists": True}, c.MISSING)
        self.ok({"$exists": False}, c.MISSING)
        self.ok({"$in": ["completed", "cancelled"]}, "cancelled")
        self.bad({"$in": ["completed"]}, "active")
        self.ok({"$size": {"$gte": 2}}, [1, 2])
        self.bad({"$size": 0}, [1])
        self.ok({"range": {"min": 1000, "max": 3000}}, 2000)
        self.bad({"range": {"min": 1000, "max": 3000}}, 999)
        self.ok({"$match": "application/(openjobspec\\+)?json"}, "application/json")
        self.ok({"a": 1}, {"a": 1, "b": 2})
        self.bad({"a": 1}, {"b": 2})
        self.ok([1, "any"], [1, {"x": 1}])
        self.bad([1], [1, 2])

    def test_status_forms(self):
        self.assertIsNone(c.match_status(201, 201))
        self.assertIsNotNone(c.match_status(201, 200))
        self.assertIsNone(c.match_status("one_of:200,409", 409))
        self.assertIsNone(c.match_status("number:range(400,422)", 422))
        self.assertIsNotNone(c.match_status({"$in": [400, 422]}, 404))

    def test_body_or_and_empty(self):
        alts = {"$or": [{"$.jobs": {"$size": 0}}, {"$empty": True}]}
        self.assertIsNone(c.match_body(alts, {"jobs": []}))
        self.assertIsNone(c.match_body(alts, c.MISSING))
        self.assertIsNotNone(c.match_body(alts, {"jobs": [1]}))

    def test_an_unknown_matcher_is_an_error_not_a_pass(self):
        with self.assertRaises(ValueError):
            c.match("string:frobnicated", "x")
        with self.assertRaises(ValueError):
            c.match({"$frob": 1}, 1)


class Queue(http.server.BaseHTTPRequestHandler):
    """Enqueue and fetch, just enough for the runner's own tests."""

    jobs: list = []
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/openjobspec+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        with self.lock:
            if self.path == "/ojs/v1/jobs":
                job = {"id": "01936f4e-8a2b-7c3d-9e4f-%012d" % len(self.jobs), "type": body["type"], "state": "available"}
                self.jobs.append(job)
                return self.answer(201, {"job": job})
            if self.path == "/ojs/v1/workers/fetch":
                got = [j for j in self.jobs if j["state"] == "available"][:1]
                for j in got:
                    j["state"] = "active"
                return self.answer(200, {"jobs": got})
        self.answer(404, {"error": {"code": "not_found"}})

    def do_GET(self):
        with self.lock:
            job = next((j for j in self.jobs if self.path == "/ojs/v1/jobs/" + j["id"]), None)
        if job:
            return self.answer(200, {"job": job})
        self.answer(404, {"error": {"code": "not_found"}})


def enqueue(assert_state):
    return {"id": "step-1", "action": "POST", "path": "/ojs/v1/jobs", "body": {"type": "t.x", "args": []},
            "assertions": {"status": 201, "body": {"$.job.id": "string:uuidv7", "$.job.state": assert_state}}}


class WholeTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Queue)
        cls.thread = threading.Thread(target=cls.server.serve_forever, kwargs={"poll_interval": 0.05})
        cls.thread.start()
        cls.target = c.Target(f"http://127.0.0.1:{cls.server.server_address[1]}", "t0ken", timeout=5)

    def setUp(self):
        Queue.jobs.clear()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.thread.join(timeout=5)
        cls.server.server_close()

    def test_a_test_whose_assertions_hold_passes(self):
        test = {"steps": [enqueue("available"), {
            "id": "step-2", "action": "GET", "path": "/ojs/v1/jobs/{{steps.step-1.response.body.job.id}}",
            "assertions": {"status": 200, "headers": {"Content-Type": "application/openjobspec+json"},
                           "body": {"$.job.id": "{{steps.step-1.response.body.job.id}}"}}}]}
        self.assertIsNone(c.run_test(test, self.target))

    def test_a_failed_assertion_fails_the_test_and_says_where(self):
        why = c.run_test({"steps": [enqueue("completed")]}, self.target)
        self.assertIn("step-1", why)
        self.assertIn("$.job.state", why)

    def test_parallel_fetches_run_together_and_exactly_one_claims_the_job(self):
        fetch = {"action": "POST", "path": "/ojs/v1/workers/fetch", "body": {"queues": ["default"]},
                 "assertions": {"status": 200}}
        claim = {"id": "step-4", "action": "ASSERT", "assertions": {"exclusive_claim": {
            "job_id": "{{steps.step-1.response.body.job.id}}",
            "fetches": ["{{steps.step-2.response.body.jobs}}", "{{steps.step-3.response.body.jobs}}"],
            "exactly_one_has_job": True, "exactly_one_empty": True}}}
        steps = [enqueue("available"), {**fetch, "id": "step-2", "parallel_with": "step-3"}, {**fetch, "id": "step-3"}, claim]
        self.assertEqual([len(g) for g in c.groups(steps)], [1, 2, 1])
        self.assertIsNone(c.run_test({"steps": steps}, self.target))
        # Two fetches answering with the job, or none, are caught.
        job = {"id": "j1"}
        for fetched, why in (([[job], [job]], "2 fetches got job"), ([[], []], "0 fetches got job")):
            resps = {f"step-{i + 2}": c.Response(200, {}, "", {"jobs": f}, 1.0) for i, f in enumerate(fetched)}
            resps["step-1"] = c.Response(201, {}, "", {"job": job}, 1.0)
            with self.assertRaises(c.Failed) as e:
                c.check_assert("step-4", claim["assertions"], {"steps": resps, "captures": {}})
            self.assertIn(why, str(e.exception))

    def test_the_report_gives_the_conformant_level(self):
        import io
        ok = c.Result("a", 0, "", "level-0-core/x.json")
        failed = c.Result("b", 1, "", "level-1-reliable/y.json", "step-1: status 500")
        out = io.StringIO()
        self.assertEqual(c.report([ok, failed], out), 1)
        self.assertIn("conformant level: 0", out.getvalue())
        out = io.StringIO()
        self.assertEqual(c.report([failed], out), 1)
        self.assertIn("conformant level: none", out.getvalue())

    def test_a_failure_by_design_passes_the_run_and_a_listed_test_that_passes_fails_it(self):
        import io
        ok = c.Result("a", 0, "", "level-0-core/x.json")
        failed = c.Result("b", 0, "", "ext-ai-agents/y.json", "step-1: $.job.state: 'pending'")
        out = io.StringIO()
        self.assertEqual(c.report([ok, failed], out, {"b": "a person approves spend"}), 0)
        self.assertIn("b: fails as expected: a person approves spend", out.getvalue())
        out = io.StringIO()
        self.assertEqual(c.report([ok, failed], out, {"a": "stale", "b": "why"}), 1)
        self.assertIn("a: PASSES but is listed as failing by design", out.getvalue())


if __name__ == "__main__":
    unittest.main()
