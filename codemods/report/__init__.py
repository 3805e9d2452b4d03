"""What a run says: findings and their codes, failures, suppressions, exit statuses, reports."""
