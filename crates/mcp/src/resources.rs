//! Jobs as MCP resources, in every revision: a client that can attach
//! resources to a conversation reads a job (`switchyard://jobs/{job_id}`,
//! what `get_job` shows) or its result (`switchyard://jobs/{job_id}/result`,
//! what `get_result` shows) without a tool call, and lists the jobs the
//! caller may see, newest first. Every read goes to the executor as the
//! caller: a URI naming a job the caller may not see is answered as one
//! naming no job at all (`-32602`, "Resource not found", the URI in `data`:
//! SEP-2164), so it tells nothing of that job.

use serde_json::{Value, json};
use switchyard_proto::executor::v1::{GetJobRequest, GetResultRequest, ListJobsRequest};

use crate::server::{SwitchyardMcp, job_json, refused, result_json};

/// The scheme and authority of Switchyard's resources.
const PREFIX: &str = "switchyard://jobs/";
/// Jobs listed in one page.
const PAGE: u32 = 50;

/// A resource request's JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResourceError {
    /// The code.
    pub code: i64,
    /// Its message.
    pub message: String,
    /// Its data, when any.
    pub data: Option<Value>,
}

impl ResourceError {
    fn not_found(uri: &str) -> ResourceError {
        ResourceError {
            code: -32602,
            message: "Resource not found".into(),
            data: Some(json!({"uri": uri})),
        }
    }

    /// The request carries no credential the services take.
    fn unauthenticated(message: String) -> ResourceError {
        ResourceError {
            code: -32600,
            message,
            data: None,
        }
    }

    fn refused(s: tonic::Status) -> ResourceError {
        ResourceError {
            code: -32603,
            message: refused(s),
            data: None,
        }
    }
}

/// What a URI names.
#[derive(Debug, PartialEq)]
enum Target<'a> {
    Job(&'a str),
    Result(&'a str),
}

fn parse(uri: &str) -> Option<Target<'_>> {
    let rest = uri.strip_prefix(PREFIX)?;
    let (id, result) = match rest.strip_suffix("/result") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    if id.is_empty() || id.contains(['/', '?', '#']) {
        return None;
    }
    Some(if result {
        Target::Result(id)
    } else {
        Target::Job(id)
    })
}

/// The two resource templates.
pub(crate) fn templates() -> Value {
    json!({"resourceTemplates": [
        {"uriTemplate": format!("{PREFIX}{{job_id}}"), "name": "job",
         "title": "A job", "mimeType": "application/json",
         "description": "A job's state, progress, tasks, cost and tokens so far (as get_job)."},
        {"uriTemplate": format!("{PREFIX}{{job_id}}/result"), "name": "job-result",
         "title": "A job's result", "mimeType": "application/json",
         "description": "A job's outputs and errors per task, total cost and tokens (as get_result)."},
    ]})
}

impl SwitchyardMcp {
    /// `resources/list`: the jobs the caller may see, newest first, a page
    /// at a time (`cursor`: the executor's page token).
    pub(crate) async fn jobs_as_resources(
        &self,
        parts: Option<&http::request::Parts>,
        cursor: Option<&str>,
    ) -> Result<Value, ResourceError> {
        let c = self
            .clients(parts)
            .map_err(ResourceError::unauthenticated)?;
        let req = ListJobsRequest {
            page_size: PAGE,
            page_token: cursor.unwrap_or_default().into(),
            ..Default::default()
        };
        let r = c
            .jobs
            .list_jobs(req)
            .await
            .map_err(ResourceError::refused)?;
        let resources: Vec<Value> = r
            .jobs
            .iter()
            .map(|j| {
                let v = job_json(j);
                let id = v["job_id"].as_str().unwrap_or_default();
                json!({"uri": format!("{PREFIX}{id}"), "name": id,
                    "title": format!("job {id} ({})", v["state"].as_str().unwrap_or_default()),
                    "mimeType": "application/json",
                    "description": format!("submitted by {}", v["submitted_by"].as_str().unwrap_or_default())})
            })
            .collect();
        let mut out = json!({ "resources": resources });
        if !r.next_page_token.is_empty() {
            out["nextCursor"] = json!(r.next_page_token);
        }
        Ok(out)
    }

    /// `resources/read` of `uri`, as the caller.
    pub(crate) async fn read_job_resource(
        &self,
        parts: Option<&http::request::Parts>,
        uri: &str,
    ) -> Result<Value, ResourceError> {
        let target = parse(uri).ok_or_else(|| ResourceError::not_found(uri))?;
        let c = self
            .clients(parts)
            .map_err(ResourceError::unauthenticated)?;
        let answer = match target {
            Target::Job(id) => c
                .jobs
                .get_job(GetJobRequest { job_id: id.into() })
                .await
                .map(|r| job_json(&r.job.unwrap_or_default())),
            Target::Result(id) => c
                .jobs
                .get_result(GetResultRequest {
                    job_id: id.into(),
                    wait: None,
                })
                .await
                .map(|r| result_json(&r)),
        };
        let value = match answer {
            Ok(v) => v,
            Err(s) if s.code() == tonic::Code::NotFound => {
                return Err(ResourceError::not_found(uri));
            }
            Err(s) => return Err(ResourceError::refused(s)),
        };
        Ok(
            json!({"contents": [{"uri": uri, "mimeType": "application/json",
            "text": value.to_string()}]}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_a_job_or_its_result_and_nothing_else() {
        assert_eq!(parse("switchyard://jobs/j-1"), Some(Target::Job("j-1")));
        assert_eq!(
            parse("switchyard://jobs/j-1/result"),
            Some(Target::Result("j-1"))
        );
        for bad in [
            "switchyard://jobs/",
            "switchyard://jobs//result",
            "switchyard://jobs/a/b",
            "switchyard://jobs/a?x=1",
            "switchyard://runs/r-1",
            "test://nonexistent-resource-for-conformance-testing",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_uri_naming_nothing_is_not_found_with_the_uri() {
        let e = ResourceError::not_found("test://x");
        assert_eq!((e.code, e.data), (-32602, Some(json!({"uri": "test://x"}))));
    }
}
